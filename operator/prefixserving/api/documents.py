"""Read the YAML documents of a resource file with bounded work and a clear error per problem.

Used by ``prefixserving validate`` and ``prefixserving render`` on files users write by hand,
so every way a file can be broken ends in :class:`InputError`, never in a traceback.

**Algorithm** (:func:`read_documents`):

1. Read at most ``MAX_BYTES`` + 1 bytes (a file, or stdin for ``-``); more is an error.
2. Decode as UTF-8 (a leading byte-order mark is dropped). Kubernetes tooling reads UTF-8.
3. Scan the YAML event stream (the parser is iterative: no recursion, whatever the nesting)
   and stop at the first of: a YAML syntax error, nesting deeper than ``MAX_DEPTH``, more
   than ``MAX_NODES`` nodes once aliases are expanded (``&a`` / ``*a``: a "billion laughs"
   file is a few hundred bytes), an alias inside the node it names (a cycle). Keys repeated in
   one mapping are collected: PyYAML would keep the last one silently, ``kubectl apply``
   refuses the file (``mapping key "x" already defined``), so they are errors here too.
4. Only then construct the documents (safe loader: plain data, no Python tags); the scan
   guarantees that this pass is shallow, small and acyclic. Empty documents (``---`` alone,
   comments) are dropped; a file with none left is an error.

**Limits**: ``MAX_BYTES`` 4 MiB (the API server refuses objects over 1.5 MiB), ``MAX_DEPTH``
64 levels of mappings and lists (a PrefixServing needs about 10), ``MAX_NODES`` 100,000.

**Cost**: O(bytes) to read and decode; the scan is O(events) and stops at the first limit
hit; construction runs only on input within the limits. Memory O(bytes + nodes).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

MAX_BYTES = 4 * 1024 * 1024
MAX_DEPTH = 64
MAX_NODES = 100_000

# libyaml's parser when PyYAML was built with it (about 10 times faster), else PyYAML's own.
_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_MERGE_KEY = "<<"


class InputError(ValueError):
    """The file cannot be read as YAML documents; ``problems`` lists every reason, each a line
    that names the place (document, line, field path) and the fix."""

    def __init__(self, source: str, problems: list[str]) -> None:
        super().__init__("\n".join(f"{source}: {p}" for p in problems))
        self.source = source
        self.problems = problems


@dataclass(frozen=True)
class Document:
    """One non-empty YAML document: its number in the file (from 1), the line its content
    starts on (from 1), and its data."""

    number: int
    line: int
    body: Any

    @property
    def where(self) -> str:
        return f"document {self.number} (line {self.line})"


@dataclass
class _Node:
    """An open mapping or list during the scan."""

    is_mapping: bool
    anchor: str | None
    size: int = 1  # nodes inside, aliases expanded, this one included
    height: int = 1  # levels of mappings and lists, this one included
    index: int = 0  # list: position of the next item
    expect_key: bool = True  # mapping: the next node is a key
    key: str | None = None  # mapping: the key of the value being read
    keys: dict[str, int] = field(default_factory=dict)  # mapping: key -> line (from 1)

    def segment(self) -> str:
        """This node's part of the path of the child being read."""
        if not self.is_mapping:
            return f"[{self.index}]"
        return "" if self.key is None else f".{self.key}"


def _path(stack: list[_Node], shown: int = 8) -> str:
    """The field path of the node being read, e.g. ``spec.engine.args[2]`` (the last
    ``shown`` parts of a deeper one)."""
    segments = [node.segment() for node in stack]
    path = "".join(segments[-shown:]).lstrip(".")
    return ("..." if len(segments) > shown else "") + path or "(top level)"


def _read_bytes(path: Path) -> bytes:
    """At most ``MAX_BYTES`` + 1 bytes: enough to tell that a file is too large."""
    if str(path) == "-":
        return sys.stdin.buffer.read(MAX_BYTES + 1)
    with path.open("rb") as stream:
        return stream.read(MAX_BYTES + 1)


def _decode(source: str, data: bytes) -> str:
    if len(data) > MAX_BYTES:
        raise InputError(
            source,
            [
                f"larger than {MAX_BYTES // (1024 * 1024)} MiB, the most this command reads"
                " (the Kubernetes API server refuses objects over 1.5 MiB): split the file"
            ],
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise InputError(
            source,
            [
                f"not UTF-8 text: byte 0x{data[error.start]:02x} at offset {error.start}"
                f" (line {line}); resource files must be UTF-8 YAML. Binary file? If it is"
                " UTF-16 text: iconv -f UTF-16 -t UTF-8 FILE > FILE.utf8"
            ],
        ) from None


def _yaml_problem(document: int, error: yaml.YAMLError) -> str:
    """One line for a PyYAML error: where, what, and the usual fix."""
    where = f"document {max(document, 1)}"
    if isinstance(error, yaml.reader.ReaderError):
        return (
            f"{where}: character #x{error.character:04x} at offset {error.position} is not"
            " allowed in YAML: remove it (is this a text file?)"
        )
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    mark = getattr(error, "problem_mark", None)
    if mark is not None:
        where += f", line {mark.line + 1}, column {mark.column + 1}"
    if "nesting depth" in problem:  # libyaml's own limit (1000) on flow collections
        return f"{where}: nested more than {MAX_DEPTH} levels deep: check the brackets"
    context = getattr(error, "context", None)
    what = problem + (f" ({context})" if context else "")
    return f"{where}: not valid YAML: {what}; check the indentation and quoting there"


class _Scan:
    """Step 3 of the module docstring over one event stream; raises :class:`InputError`."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.stack: list[_Node] = []
        self.anchors: dict[str, tuple[int, int]] = {}  # anchor -> (size, height)
        self.open_anchors: set[str] = set()
        self.nodes = 0
        self.document = 0
        self.lines: list[int] = []  # per document: the line its content starts on
        self.repeated: list[str] = []  # repeated keys (the scan goes on after them)

    def fail(self, line: int, message: str) -> InputError:
        return InputError(self.source, [f"document {self.document}, line {line}: {message}"])

    def run(self, text: str) -> None:
        try:
            for event in yaml.parse(text, Loader=_LOADER):
                self.event(event)
        except yaml.YAMLError as error:
            raise InputError(self.source, [_yaml_problem(self.document, error)]) from None
        if self.repeated:
            raise InputError(self.source, self.repeated)

    def event(self, event: yaml.Event) -> None:
        line = event.start_mark.line + 1 if event.start_mark is not None else 1
        if isinstance(event, yaml.DocumentStartEvent):
            self.document += 1
            self.lines.append(0)
            self.anchors.clear()  # anchors do not cross documents
            return
        if isinstance(event, yaml.SequenceEndEvent | yaml.MappingEndEvent):
            self.close()
            return
        if not isinstance(event, yaml.NodeEvent):
            return
        if self.lines[-1] == 0:
            self.lines[-1] = line
        if isinstance(event, yaml.ScalarEvent):
            self.leaf(event.anchor, event.value, 1, 0, line)
        elif isinstance(event, yaml.AliasEvent):
            self.alias(event.anchor, line)
        else:
            self.open(event.anchor, isinstance(event, yaml.MappingStartEvent), line)

    def count(self, size: int, line: int) -> None:
        self.nodes += size
        if self.nodes > MAX_NODES:
            raise self.fail(
                line,
                f"more than {MAX_NODES} values (YAML aliases expand to copies); a resource"
                " file is far smaller: remove the aliases or split the file",
            )

    def open(self, anchor: str | None, is_mapping: bool, line: int) -> None:
        if len(self.stack) >= MAX_DEPTH:
            raise self.fail(
                line,
                f"nested more than {MAX_DEPTH} levels deep at {_path(self.stack)};"
                " a resource needs about 10: check the brackets and indentation",
            )
        self.count(1, line)
        if anchor is not None:
            self.open_anchors.add(anchor)
        self.stack.append(_Node(is_mapping, anchor))

    def close(self) -> None:
        node = self.stack.pop()
        if node.anchor is not None:
            self.open_anchors.discard(node.anchor)
            self.anchors[node.anchor] = (node.size, node.height)
        if self.stack:
            self.add_to_parent(node.size, node.height, None, 0)

    def alias(self, anchor: str, line: int) -> None:
        if anchor in self.open_anchors:
            raise self.fail(
                line,
                f"alias *{anchor} at {_path(self.stack)} is inside the node &{anchor} names,"
                " which makes the data endless: copy the values instead",
            )
        size, height = self.anchors.get(anchor, (1, 0))  # undefined: the loader reports it
        if len(self.stack) + height > MAX_DEPTH:
            raise self.fail(
                line, f"alias *{anchor} at {_path(self.stack)} nests more than {MAX_DEPTH} levels"
            )
        self.leaf(None, None, size, height, line)

    def leaf(
        self, anchor: str | None, scalar: str | None, size: int, height: int, line: int
    ) -> None:
        """A scalar (size 1, height 0) or an expanded alias."""
        self.count(size, line)
        if anchor is not None:
            self.anchors[anchor] = (size, height)
        if self.stack:
            self.add_to_parent(size, height, scalar, line)

    def add_to_parent(self, size: int, height: int, scalar: str | None, line: int) -> None:
        """Advance the parent past one child: a list item, a mapping key or a mapping value."""
        parent = self.stack[-1]
        parent.size += size
        parent.height = max(parent.height, height + 1)
        if not parent.is_mapping:
            parent.index += 1
            return
        if parent.expect_key:
            parent.key = scalar
            if scalar is not None and scalar != _MERGE_KEY:
                self.check_repeated(parent, scalar, line)
        parent.expect_key = not parent.expect_key

    def check_repeated(self, mapping: _Node, key: str, line: int) -> None:
        first = mapping.keys.get(key)
        if first is None:
            mapping.keys[key] = line
            return
        self.repeated.append(
            f"document {self.document}, line {line}: {_path(self.stack)} is set twice (also on"
            f" line {first}); YAML would keep only the last value and kubectl refuses the"
            " file: keep one"
        )


def parse_documents(source: str, text: str) -> list[Document]:
    """The non-empty documents of ``text`` (steps 3 and 4); ``source`` names it in errors."""
    scan = _Scan(source)
    scan.run(text)
    try:
        bodies = list(yaml.load_all(text, Loader=_LOADER))
    except yaml.YAMLError as error:  # e.g. an undefined alias, a list used as a key
        raise InputError(source, [_yaml_problem(scan.document, error)]) from None
    documents = [
        Document(number, line, body)
        for number, (line, body) in enumerate(zip(scan.lines, bodies, strict=True), start=1)
        if body is not None
    ]
    if not documents:
        raise InputError(
            source,
            [
                "no PrefixServing or ScalingPolicy in the file (it is empty, or holds only"
                " comments and '---'); see examples/minimal.yaml"
            ],
        )
    return documents


def source_name(path: Path) -> str:
    """How messages name a file: its path, or ``stdin`` for ``-``."""
    return "stdin" if str(path) == "-" else str(path)


def read_documents(path: Path) -> list[Document]:
    """Steps 1 to 4 for a file (``-``: stdin). Raises :class:`InputError`."""
    source = source_name(path)
    try:
        data = _read_bytes(path)
    except OSError as error:
        raise InputError(source, [f"cannot be read: {error.strerror or error}"]) from None
    return parse_documents(source, _decode(source, data))
