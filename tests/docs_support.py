"""The shell commands of the docs, and checks of the names they use (for test_docs_commands).

**Extraction** (:func:`doc_commands`): from README.md, every ``docs/**/*.md`` and the chart's
README:

- each line of a fenced ``sh``/``bash``/``shell``/``console`` block (``console``: only lines
  with a ``$ `` prompt), with backslash continuations joined and comments dropped;
- each inline code span in prose that starts with a program the docs tell users to run
  (``helm``, ``kubectl``, ``prefixserving``, ``make``, ``python``, ``pytest``, ``bash``) and
  has arguments (for helm and kubectl: beyond a subcommand; ``kubectl edit`` alone is a
  mention), or starts with ``--set`` (a value of this project's chart, said in prose);
- each chart value named in prose ("chart value `prometheusUrl`"), as setting it.

Each line is split into commands at ``|``, ``&&``, ``||``, ``;`` and ``&``.

**Checks** (:func:`static_problems`, per program; a placeholder is ``<...>`` or an
upper-case word such as ``NAME``):

- ``helm install|upgrade|template`` of this chart and ``--set`` fragments: every ``--set`` key
  is a value in ``values.schema.json``. (Running ``helm template`` is the slow test's job.)
- ``prefixserving ...``: the subcommand exists, every flag is one of its options, a value of a
  choice option is one of its choices.
- ``make TARGET NAME=value``: the target is in the Makefile and it sets the variable.
  ``python``/``pytest``/``bash`` with a repo path: the file exists; ``python -m MODULE``: the
  module is importable.
- ``kubectl``: resource types exist (this project's names from ``crds/``, others from the list
  of built-in and add-on types below); ``-f`` files in the repo exist and, for this project's
  kinds, pass ``prefixserving validate``; ``-o jsonpath`` and ``explain`` paths and ``patch -p``
  fields on this project's kinds exist in the CRD schema (enum values included); the engine and
  router objects, containers and Event reasons named exist in what the operator renders and
  emits; a custom metric asked of ``custom.metrics.k8s.io`` is one the chart's adapter rules
  serve.
- ``vllm serve --scheduler-cls X``: X is the PEEK scheduler's class path.
- Other programs (``curl``, ``argocd``, ``grep``...) need a running system: listed in
  ``UNCHECKED`` with the reason, and any program not listed there or above fails the test.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import click
import yaml

from prefixserving import constants
from prefixserving.api import lifecycle
from prefixserving.api.validation import parse_resource
from prefixserving.cli import main as prefixserving_main
from prefixserving.render import render_children

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "prefixserving-operator"
DOC_FILES = [ROOT / "README.md", CHART / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# How the docs name this project's chart: the local folder and the published repository.
OUR_CHARTS = ("charts/prefixserving-operator", "prefixserving/prefixserving-operator")
SHELL_BLOCKS = ("sh", "bash", "shell", "console")
PROGRAMS = ("helm", "kubectl", "prefixserving", "make", "python", "python3", "pytest", "bash")
# Top-level folders of the repository: a path starting with one must exist.
REPO_DIRS = tuple(p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith("."))
# Programs whose commands need a running system; what is not checked, and why.
UNCHECKED: dict[str, str] = {
    "curl": "asks a running router, engine or warm-up sidecar",
    "grpcurl": "asks a running endpoint picker's gRPC port",
    "istioctl": "installs Istio into the user's cluster",
    "argocd": "needs an Argo CD server",
    "grep": "filters the output of the command before it",
    "iconv": "converts the user's own file",
}
SEPARATORS = ("|", "||", "&&", ";", "&")
# Built-in and add-on resource types the docs name (kubectl's names and short names).
KNOWN_TYPES = frozenset(
    {
        "pod", "pods", "po", "deployment", "deployments", "deploy", "service", "services",
        "svc", "configmap", "configmaps", "cm", "event", "events", "ev", "secret", "secrets",
        "namespace", "namespaces", "ns", "horizontalpodautoscaler", "horizontalpodautoscalers",
        "hpa", "poddisruptionbudget", "poddisruptionbudgets", "pdb", "crd", "crds",
        "customresourcedefinition", "customresourcedefinitions", "apiservice", "apiservices",
        "scaledobject", "scaledobjects", "servicemonitor", "servicemonitors",
        "prometheusrule", "prometheusrules", "node", "nodes", "no",
        "clusterkopfpeering", "clusterkopfpeerings", "kopfpeering", "kopfpeerings",
        "inferencepool", "inferencepools", "infpool", "gateway", "gateways", "httproute",
        "httproutes",
    }
)  # fmt: skip
KUBECTL_VALUE_FLAGS = frozenset(
    {
        "-n", "--namespace", "-o", "--output", "-c", "--container", "-f", "--filename", "-p",
        "--patch", "--type", "--field-selector", "-l", "--selector", "--raw", "--patch-file",
        "--from-file", "--context",
    }
)  # fmt: skip
_PLACEHOLDER = re.compile(r"<[^>]*>|^[A-Z][A-Z_]*$")


@dataclass(frozen=True)
class Command:
    """One command of the docs: where it is, its text as written and its words."""

    file: str
    line: int
    text: str
    argv: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: `{self.text}`"

    @property
    def program(self) -> str:
        """The program, without a ``.venv/bin/`` or ``./`` prefix."""
        return self.argv[0].rsplit("/", 1)[-1]


def is_placeholder(word: str) -> bool:
    return bool(_PLACEHOLDER.search(word))


def _split(text: str) -> Iterator[list[str]]:
    """The commands of one shell line, split at control operators; comments dropped."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars="|&;")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    current: list[str] = []
    for token in lexer:
        if token in SEPARATORS:
            if current:
                yield current
            current = []
        else:
            current.append(token)
    if current:
        yield current


def commands_in_line(
    file: str, line: int, text: str, shown: str | None = None
) -> Iterator[Command]:
    """The commands of a shell line; ``shown`` is how the doc writes it, when not as is."""
    for argv in _split(text):
        yield Command(file, line, shown or " ".join(argv), tuple(argv))


def _block_lines(lines: list[str], start: int, info: str) -> Iterator[tuple[int, str]]:
    """Logical lines of a fenced block from ``start`` (continuations joined)."""
    pending: tuple[int, str] | None = None
    for number in range(start, len(lines)):
        raw = lines[number]
        if raw.lstrip().startswith("```"):
            break
        text = raw.strip()
        if info == "console":
            if not text.startswith("$ ") and pending is None:
                continue
            text = text.removeprefix("$ ")
        if pending is not None:
            text = pending[1] + " " + text
            first = pending[0]
        else:
            first = number + 1
        if text.endswith("\\"):
            pending = (first, text[:-1].rstrip())
            continue
        pending = None
        if text and not text.startswith("#"):
            yield first, text


def _value_default(key: str) -> str:
    """The chart's default of a value (``x`` when it has none), as ``--set`` writes it."""
    node: Any = yaml.safe_load((CHART / "values.yaml").read_text())
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return "x"
        node = node[part]
    return "" if node is None else str(node).lower() if isinstance(node, bool) else str(node)


def _inline_spans(line: str) -> Iterator[tuple[str, str]]:
    """(the span, the shell line it stands for) for each command in a line of prose. A value
    named in prose ("chart value `x.y`") stands for setting it to its default."""
    our_chart = "helm upgrade prefixserving charts/prefixserving-operator"
    for key in re.findall(r"chart value `([\w.]+)`", line):
        yield key, f"{our_chart} --set {key}={_value_default(key)}"
    for span in re.findall(r"`([^`]+)`", line):
        words = span.split()
        if words[0] == "--set":
            yield span, f"{our_chart} {span}"
        elif words[0] in PROGRAMS and len(words) > (2 if words[0] in ("helm", "kubectl") else 1):
            yield span, span


def doc_commands() -> list[Command]:
    """Every command of the docs (see the module docstring)."""
    found: list[Command] = []
    for path in DOC_FILES:
        file = str(path.relative_to(ROOT))
        lines = path.read_text().splitlines()
        number = 0
        while number < len(lines):
            fence = re.match(r"^\s*```(\w*)", lines[number])
            if fence:
                info = fence.group(1)
                end = number + 1
                while end < len(lines) and not lines[end].lstrip().startswith("```"):
                    end += 1
                if info in SHELL_BLOCKS:
                    for line, text in _block_lines(lines, number + 1, info):
                        found += commands_in_line(file, line, text)
                number = end + 1
                continue
            for span, text in _inline_spans(lines[number]):
                found += commands_in_line(
                    file, number + 1, text, shown=span if span != text else None
                )
            number += 1
    return found


# --- helm -----------------------------------------------------------------------------------


def _split_set(value: str) -> list[tuple[str, str]]:
    """``a.b=1,c={x,y}`` -> [("a.b", "1"), ("c", "{x,y}")] (commas inside braces kept)."""
    pairs, depth, start = [], 0, 0
    for i, char in enumerate(value + ","):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
        elif char == "," and depth == 0:
            key, _, val = value[start:i].partition("=")
            pairs.append((key, val))
            start = i + 1
    return pairs


def helm_values(cmd: Command) -> list[tuple[str, str]]:
    """The ``--set`` (and ``--set-string``) key/value pairs of a helm command."""
    out: list[tuple[str, str]] = []
    args = list(cmd.argv)
    for i, arg in enumerate(args):
        name, eq, inline = arg.partition("=")
        if name in ("--set", "--set-string"):
            value = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
            out += _split_set(value)
    return out


HELM_FLAG = re.compile(r"^\s+(?:(-\w), )?(--[\w-]+)(?: (\S+))?\s{2,}\S", re.MULTILINE)


def helm_flags(help_text: str) -> dict[str, bool]:
    """Flags in ``helm SUBCOMMAND --help`` -> whether a value follows as the next word."""
    flags = {}
    for short, long, type_ in HELM_FLAG.findall(help_text):
        takes = bool(type_) and "[=" not in type_
        flags[long] = takes
        if short:
            flags[short] = takes
    return flags


def helm_split(cmd: Command, flags: dict[str, bool]) -> tuple[list[str], list[list[str]]]:
    """The positional words after the subcommand, and each flag with its value."""
    positional: list[str] = []
    options: list[list[str]] = []
    args = list(cmd.argv[2:])
    i = 0
    while i < len(args):
        word = args[i]
        i += 1
        if not word.startswith("-"):
            positional.append(word)
        elif "=" in word or not flags.get(word, False):
            options.append([word])
        else:
            options.append([word, args[i]])
            i += 1
    return positional, options


# Flags of ``helm install`` that take a value (enough to find the chart without helm).
_HELM_VALUE_FLAGS = dict.fromkeys(("--set", "--set-string", "-n", "--namespace", "-f"), True)


def helm_chart(cmd: Command) -> str | None:
    """The chart of ``helm install|upgrade|template NAME CHART`` (None for other
    subcommands)."""
    if len(cmd.argv) < 2 or cmd.argv[1] not in ("install", "upgrade", "template"):
        return None
    positional, _ = helm_split(cmd, _HELM_VALUE_FLAGS)
    return positional[1] if len(positional) > 1 else None


@cache
def values_schema() -> dict[str, Any]:
    return json.loads((CHART / "values.schema.json").read_text())


def schema_problem(schema: dict[str, Any], parts: list[str], where: str) -> str | None:
    """Why the value at ``parts`` is not in ``schema`` (JSON schema), or None."""
    node = schema
    for depth, part in enumerate(parts):
        name = re.sub(r"\[\d+\]$", "", part)
        properties = node.get("properties", {})
        if name in properties:
            node = properties[name]
        elif node.get("additionalProperties") not in (None, False) or (
            "properties" not in node and node.get("type") == "object"
        ):
            return None  # a free-form mapping (labels, annotations)
        else:
            known = ", ".join(sorted(properties)) or "none"
            path = ".".join(parts[: depth + 1])
            return f"{where} has no value {path!r} (known here: {known})"
        if part != name:
            node = node.get("items", {})
    return None


# --- prefixserving --------------------------------------------------------------------------


def resolve_cli(argv: list[str]) -> tuple[click.Command, list[str], list[str]]:
    """The click command an argv names, the words that name it, and the rest."""
    command: click.Command = prefixserving_main
    path: list[str] = []
    rest = list(argv)
    while isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
        sub = command.get_command(click.Context(command), rest[0])
        if sub is None:
            raise LookupError(f"no subcommand {rest[0]!r} of `prefixserving {' '.join(path)}`")
        command = sub
        path.append(rest.pop(0))
    return command, path, rest


def cli_problems(command: click.Command, rest: list[str]) -> list[str]:
    """Unknown flags and invalid choices among ``rest``."""
    options = {opt: p for p in command.params for opt in (*p.opts, *p.secondary_opts)}
    problems = []
    i = 0
    while i < len(rest):
        word = rest[i]
        i += 1
        if not word.startswith("-") or word == "-":
            continue
        name, eq, inline = word.partition("=")
        if name == "--help":
            continue
        param = options.get(name)
        if param is None:
            known = ", ".join(sorted(o for o in options if o.startswith("--")))
            problems.append(f"`{command.name}` has no option {name} (options: {known})")
            continue
        if isinstance(param, click.Option) and param.is_flag:
            continue
        value = inline if eq else (rest[i] if i < len(rest) else "")
        i += 0 if eq else 1
        choice = isinstance(param.type, click.Choice) and not is_placeholder(value)
        if choice and value not in param.type.choices:
            choices = ", ".join(map(str, param.type.choices))
            problems.append(f"{name} {value!r} is not one of {choices}")
    return problems


# --- kubectl --------------------------------------------------------------------------------


@cache
def crds() -> dict[str, dict[str, Any]]:
    """Every name kubectl accepts for this project's kinds -> that CRD's openAPIV3Schema."""
    out = {}
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        names = crd["spec"]["names"]
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for name in (names["plural"], names["singular"], *names.get("shortNames", [])):
            out[name] = schema
        out[names["kind"].lower()] = schema
        out[f"{names['plural']}.{crd['spec']['group']}"] = schema
    return out


def openapi_problem(schema: dict[str, Any], path: list[str], where: str) -> str | None:
    """Why ``path`` (field names, ``[]`` for a list item) is not in an OpenAPI schema."""
    node = schema
    for depth, part in enumerate(path):
        if part == "[]":
            if node.get("type") != "array":
                return f"{where}: {'.'.join(path[:depth])} is not a list"
            node = node.get("items", {})
            continue
        if node.get("x-kubernetes-preserve-unknown-fields") or (
            node.get("type") == "object" and "properties" not in node
        ):
            return None
        properties = node.get("properties", {})
        if part not in properties:
            known = ", ".join(sorted(properties))
            field = ".".join(p for p in path[: depth + 1] if p != "[]")
            return f"{where}: no field {field!r} in the CRD (known here: {known})"
        node = properties[part]
    return None


def jsonpath_fields(expression: str) -> list[list[str]]:
    """The field paths of a kubectl jsonpath template: ``{.status.conditions[?(@.type=="X")]
    .message}`` -> [["status", "conditions", "[]", "message"], [..."[]", "type"]]."""
    paths = []
    for inner in re.findall(r"\{([^{}]*)\}", expression):
        inner = inner.strip()
        if not inner.startswith("."):
            if inner.startswith("range"):
                raise ValueError(f"jsonpath {{{inner}}}: range is not checked; add it")
            continue  # a literal such as {"\n"}
        path: list[str] = []
        for name, bracket in re.findall(r"\.([A-Za-z_][\w-]*)|\[([^\]]*)\]", inner):
            if name:
                path.append(name)
                continue
            path.append("[]")
            for field in re.findall(r"@\.([A-Za-z_]\w*)", bracket):
                paths.append([*path, field])
        paths.append(path)
    return paths


def patch_problems(schema: dict[str, Any], patch: Any, path: list[str], where: str) -> list[str]:
    """Fields of a merge patch that the CRD schema lacks, and enum values it refuses."""
    if path == ["metadata"] or patch is None:
        return []  # ObjectMeta is the API server's; null removes a field
    problem = openapi_problem(schema, path, where)
    if problem is not None:
        return [problem]
    node = schema
    for part in path:
        node = node.get("properties", {}).get(part, {})
    if isinstance(patch, dict):
        return [p for k, v in patch.items() for p in patch_problems(schema, v, [*path, k], where)]
    enum = node.get("enum")
    if enum is not None and patch not in enum:
        return [f"{where}: {'.'.join(path)}: {patch!r} is not one of {', '.join(map(str, enum))}"]
    return []


@dataclass(frozen=True)
class KubectlArgs:
    """A kubectl command: verb, positional words, and option values."""

    verb: str
    positional: list[str]
    options: dict[str, str]


def parse_kubectl(cmd: Command) -> KubectlArgs:
    positional: list[str] = []
    options: dict[str, str] = {}
    args = list(cmd.argv[1:])
    i = 0
    while i < len(args):
        word = args[i]
        i += 1
        if word == "--":
            break  # the command kubectl exec runs
        if word.startswith("-"):
            name, eq, inline = word.partition("=")
            if name in KUBECTL_VALUE_FLAGS:
                options[name] = inline if eq else args[i]
                i += 0 if eq else 1
            else:
                options[name] = ""
            continue
        positional.append(word)
    return KubectlArgs(positional[0], positional[1:], options)


@cache
def rendered_children(name: str) -> dict[tuple[str, str], dict[str, Any]]:
    """What the operator renders for examples/warmup.yaml named ``name``: (kind, name) -> obj."""
    body = yaml.safe_load((ROOT / "examples" / "warmup.yaml").read_text())
    body["metadata"]["name"] = name
    return {(c["kind"], c["metadata"]["name"]): c for c in render_children(parse_resource(body))}


_KIND_OF_TYPE = {
    "deploy": "Deployment",
    "deployment": "Deployment",
    "svc": "Service",
    "service": "Service",
}


def child_problem(type_: str, name: str, where: str) -> str | None:
    """Whether a Deployment or Service of a PrefixServing the docs name (``my-model-...`` or
    ``<name>-...``, the docs' example names) is one the operator renders."""
    kind = _KIND_OF_TYPE.get(type_)
    match = re.fullmatch(r"(?:<[^>]*>|my-model)-(.+)", name)
    if kind is None or match is None:
        return None  # another project's object
    full = f"my-model-{match.group(1)}"
    if (kind, full) not in rendered_children("my-model"):
        made = sorted(n for k, n in rendered_children("my-model") if k == kind)
        return f"{where}: the operator renders no {kind} {full} (it renders {', '.join(made)})"
    return None


def containers_of_engine() -> set[str]:
    (engine,) = [
        obj
        for (kind, name), obj in rendered_children("my-model").items()
        if kind == "Deployment" and name.endswith("-engine")
    ]
    pod = engine["spec"]["template"]["spec"]
    # The warm-up sidecar is a native sidecar: an init container that keeps running.
    return {c["name"] for c in [*pod["containers"], *pod.get("initContainers", [])]}


def event_reasons() -> set[str]:
    modules = (constants, lifecycle)
    return {getattr(m, n) for m in modules for n in dir(m) if n.startswith("REASON_")}


def adapter_metrics() -> set[str]:
    rules = yaml.safe_load((CHART / "files" / "prometheus-adapter-rules.yaml").read_text())
    return {rule["name"]["as"] for rule in rules["rules"]}


def kubectl_problems(cmd: Command, validate: Any) -> list[str]:
    """See the module docstring; ``validate(path)`` returns problems of a resource file."""
    args = parse_kubectl(cmd)
    where = str(cmd)
    problems: list[str] = []
    words = list(args.positional)
    types: list[str] = []
    if args.verb in ("get", "describe", "patch", "edit", "delete", "explain") and words:
        first = words.pop(0)
        if "/" in first:
            first, _, name = first.partition("/")
            words.insert(0, name)
        types = first.split(",")
        if args.verb == "explain":
            resource, *fields = types[0].split(".")
            types = [resource]
            if resource in crds():
                problems += filter(None, [openapi_problem(crds()[resource], fields, where)])
    elif args.verb in ("logs", "exec", "port-forward") and words and "/" in words[0]:
        type_, _, name = words[0].partition("/")
        types = [type_]
        words = [name]
    elif args.verb == "create" and words:
        types = [words.pop(0)]
    for type_ in (t.lower() for t in types):
        if type_ not in crds() and type_ not in KNOWN_TYPES and not is_placeholder(type_):
            problems.append(f"{where}: kubectl has no resource type {type_!r}")
    ours = [t for t in types if t in crds()]
    if ours:
        schema = crds()[ours[0]]
        output = args.options.get("-o", args.options.get("--output", ""))
        if output.startswith("jsonpath="):
            for path in jsonpath_fields(output.removeprefix("jsonpath=")):
                problems += filter(None, [openapi_problem(schema, path, where)])
        if args.verb == "patch" and "-p" in args.options:
            problems += patch_problems(schema, json.loads(args.options["-p"]), [], where)
    for type_ in types:
        for name in words[:1]:
            problems += filter(None, [child_problem(type_, name, where)])
    container = args.options.get("-c", args.options.get("--container"))
    if container and container not in containers_of_engine():
        problems.append(f"{where}: engine pods have no container {container!r}")
    selector = args.options.get("--field-selector", "")
    for reason in re.findall(r"reason=(\w+)", selector):
        if reason not in event_reasons():
            problems.append(f"{where}: the operator never records an Event with reason {reason}")
    raw = args.options.get("--raw", "")
    if raw.startswith("/apis/custom.metrics.k8s.io/"):
        metric = raw.rsplit("/", 1)[-1]
        if metric not in adapter_metrics():
            problems.append(f"{where}: the chart's adapter rules serve no metric {metric!r}")
    for key in ("-f", "--filename"):
        path = args.options.get(key)
        if path and args.verb == "apply":
            problems += file_problems(path, where, validate)
    return problems


def file_problems(path: str, where: str, validate: Any) -> list[str]:
    """A repo path must exist; a file of this project's kinds must validate."""
    if path.split("/", 1)[0] not in REPO_DIRS:
        return []  # the user's own file
    file = ROOT / path
    if not file.exists():
        return [f"{where}: {path} does not exist"]
    kinds = {d.get("kind") for d in yaml.safe_load_all(file.read_text()) if isinstance(d, dict)}
    if kinds & {constants.KIND, constants.POLICY_KIND}:
        return [f"{where}: {p}" for p in validate(path)]
    return []


# --- everything -----------------------------------------------------------------------------


@cache
def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z][\w-]*):", text, flags=re.MULTILINE))


def make_variables() -> set[str]:
    """Variables the Makefile assigns (``NAME ?=``, ``NAME :=``, ``NAME =``)."""
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Z_][A-Z0-9_]*)\s*[?:]?=", text, flags=re.MULTILINE))


def make_problems(args: list[str], where: str) -> list[str]:
    """``make`` arguments: each target exists, each ``NAME=value`` names a Makefile variable."""
    problems = []
    for arg in args:
        name, is_variable, _ = arg.partition("=")
        if is_variable:
            if name not in make_variables():
                problems.append(f"{where}: the Makefile sets no variable {name!r}")
        elif arg not in make_targets():
            problems.append(f"{where}: no make target {arg!r}")
    return problems


def static_problems(cmd: Command, validate: Any) -> list[str]:
    """Every problem of ``cmd`` that needs no subprocess (see the module docstring)."""
    where = str(cmd)
    program, args = cmd.program, list(cmd.argv[1:])
    if program == "helm":
        chart = helm_chart(cmd)
        if chart in OUR_CHARTS:
            return [
                problem
                for key, _ in helm_values(cmd)
                if (problem := schema_problem(values_schema(), key.split("."), where))
            ]
        return []  # another project's chart; helm's own flags are the slow test's
    if program == "prefixserving":
        try:
            command, _, rest = resolve_cli(args)
        except LookupError as error:
            return [f"{where}: {error}"]
        return [f"{where}: {p}" for p in cli_problems(command, rest)]
    if program == "make":
        return make_problems(args, where)
    if program in ("python", "python3", "pytest", "bash"):
        if args[:1] == ["-m"]:
            found = importlib.util.find_spec(args[1].split(".")[0]) is not None
            return [] if found else [f"{where}: no module {args[1]}"]
        paths = [a for a in args if a.split("/", 1)[0] in REPO_DIRS]
        return [f"{where}: {p} does not exist" for p in paths if not (ROOT / p).exists()]
    if program == "kubectl":
        return kubectl_problems(cmd, validate)
    if program == "vllm":
        values = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--scheduler-cls"]
        return [
            f"{where}: --scheduler-cls {v} is not {constants.PEEK_SCHEDULER_CLS}"
            for v in values
            if v != constants.PEEK_SCHEDULER_CLS
        ]
    if program in UNCHECKED:
        return []
    return [f"{where}: no check for {program!r}: add one, or list it in UNCHECKED with why"]
