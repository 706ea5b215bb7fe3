"""A request body that arrives in chunks -> the fields the prefix key reads, decoding nothing
else (the endpoint picker's body reader; the HTTP router parses whole bodies with
``prefix_hashing.parse_body``).

The prefix key (``router.prefix_hashing``) reads five top-level fields: ``model``,
``messages`` or ``prompt``, ``tools`` and ``cache_salt``. JSON gives no order, and a field's
absence (or a later duplicate, which wins in Python's parser) shows only at the closing brace,
so every chunk is read. What is decoded is bounded instead: a 200 KB prompt is scanned, not
parsed.

**Algorithm** (:class:`StreamedBody`; :meth:`~StreamedBody.feed` per chunk,
:meth:`~StreamedBody.finish` at the end of the body):

1. Each chunk is checked as UTF-8 (an incremental decoder, so a bad byte is reported with the
   chunk that holds it) and appended to a scan buffer. A body of at most
   :data:`FULL_PARSE_BYTES` is then parsed whole at the end, exactly as the HTTP router does;
   steps 2-3 are for larger ones, from the chunk that crosses the limit on.
2. A resumable scanner (a generator that waits when a token runs past the buffer) walks the
   top-level object. Strings are skipped with ``find`` of the next quote and a count of the
   backslashes before it (a regex that skips escaped quotes once a string has many);
   containers with a search for the next bracket or quote; numbers and literals with one
   regex. It records where the value of each key field starts and ends (the last one wins),
   where each element of ``messages`` starts, and where the ``content`` string of each
   message lies. Grammar errors of the top-level object, of ``messages`` and
   of its objects, unbalanced brackets and unclosed strings anywhere are reported.
3. At the end of the body the view is decoded: ``model``, ``tools`` and ``cache_salt`` whole;
   messages one by one until their canonical rendering covers the key's depth
   (``KeyConfig.max_chars``), each ``content`` string longer than :func:`raw_limit` bytes
   decoded from its first ``raw_limit`` bytes only; the later messages stand in as ``{}``
   (their first byte showed an object); a string ``prompt`` likewise from its first
   ``raw_limit`` bytes. :func:`raw_limit` bytes hold at least ``max_chars`` characters (a
   character is at most 12 bytes of JSON: a surrogate pair escape), so the view renders and
   hashes exactly as the whole body would: the same key, the same hot-prefix replay body.

What the HTTP router also rejects and the picker leaves to the engine (which answers 400 for
it): a JSON error inside a value the key does not read (``"max_tokens": tru``, a bad escape
or a raw control character past the decoded part of a long string, an integer of over 4,300
digits, nesting deeper than Python's parser goes).

**Parameters**: ``key_config`` (what the key reads), ``max_bytes`` (largest body; over it
:class:`BodyTooLarge`).

**Cost**: per chunk one UTF-8 check and one copy into the scan buffer (``memcpy``-speed).
Over :data:`FULL_PARSE_BYTES`, O(tokens) Python steps, where a string of any length is a
``memchr`` search for its closing quote plus one step per escaped quote (past eight, a regex
search that skips them: about 0.7 GB/s); at the end the decoding of the key fields:
O(``max_chars``) for the leading content. Measured on a 200 KB chat body: about 0.25 ms
against 1.1 ms to parse it whole. Memory: the scan buffer (the body) until the pick.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

from prefixserving.router.prefix_hashing import KeyConfig, RequestError, parse_body, render_chat

# Bodies up to this size are parsed whole (``parse_body``, as the HTTP router does): below it
# Python's C parser is cheaper than the scanner's per-token steps (measured: equal at about
# 64 KB of chat; at 200 KB the scanner takes a fifth of the parser's time).
FULL_PARSE_BYTES = 64 * 1024
KEY_FIELDS = frozenset({"model", "messages", "prompt", "tools", "cache_salt"})
# Bytes of JSON string per decoded character, at most: an escaped surrogate pair.
MAX_BYTES_PER_CHAR = 12

_QUOTE, _BACKSLASH = 0x22, 0x5C
_LBRACE, _RBRACE, _LBRACKET, _RBRACKET = 0x7B, 0x7D, 0x5B, 0x5D
_WS_BYTES = frozenset(b" \t\n\r")
_WS = re.compile(rb"[ \t\n\r]*")
# A quote that may close a string: not after a backslash, or after two (an escaped backslash;
# the run's parity decides). One search with a literal first byte: memchr-speed.
_CLOSING_QUOTE = re.compile(rb'"(?:(?<!\\")|(?<=\\\\"))')
_ESCAPED_QUOTES_BEFORE_REGEX = 8
_STRUCTURAL = re.compile(rb'["{}\[\]]')
_SCALAR = re.compile(
    rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|true|false|null|NaN|-?Infinity"
)
# The generator yields this when it needs more bytes.
_MORE = None


class BodyTooLarge(Exception):
    """The body is over ``max_bytes``."""


def raw_limit(config: KeyConfig) -> int:
    """Bytes of a JSON string that always hold the ``config.max_chars`` characters the key
    reads (and one more, so a cut escape or character never reaches them)."""
    return MAX_BYTES_PER_CHAR * (config.max_chars + 1)


def _not_json(detail: str) -> RequestError:
    return RequestError(f"request body is not valid JSON: {detail}")


@dataclass(slots=True)
class _Message:
    """One element of ``messages``: its span, and the span of its ``content`` string."""

    start: int
    end: int = 0
    content: tuple[int, int] | None = None


@dataclass(slots=True)
class _Field:
    """A key field's value span; for ``messages`` also its elements."""

    start: int
    end: int
    messages: list[_Message] | None = None


@dataclass
class StreamedBody:
    """One request body, fed chunk by chunk (see the module docstring)."""

    key_config: KeyConfig
    max_bytes: int
    buffer: bytearray = field(default_factory=bytearray)
    fields: dict[str, _Field] = field(default_factory=dict)
    _ended: bool = False
    _done: bool = False

    def __post_init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._scan = self._document()

    @property
    def size(self) -> int:
        return len(self.buffer)

    def feed(self, chunk: bytes) -> None:
        """Add the next chunk: :class:`BodyTooLarge` over ``max_bytes``, :class:`RequestError`
        for a byte that is not UTF-8 or a JSON error found so far."""
        offset = len(self.buffer)
        if offset + len(chunk) > self.max_bytes:
            raise BodyTooLarge(f"request body is over the limit of {self.max_bytes} bytes")
        try:
            self._utf8.decode(chunk)
        except UnicodeDecodeError as error:
            pending = len(self._utf8.getstate()[0])
            position = offset - pending + error.start
            data = bytes(self.buffer[offset - pending :]) + chunk
            raise RequestError(
                f"request body is not UTF-8 (byte 0x{data[error.start]:02x} at offset"
                f" {position}); send JSON encoded as UTF-8"
            ) from None
        self.buffer += chunk
        if len(self.buffer) > FULL_PARSE_BYTES:
            self._step()

    def finish(self) -> dict[str, Any]:
        """The end of the body: the view of the key fields (a dict the key functions of
        ``router.prefix_hashing`` read like the parsed body), or :class:`RequestError`."""
        self._ended = True
        try:
            self._utf8.decode(b"", final=True)
        except UnicodeDecodeError:
            raise RequestError(
                f"request body is not UTF-8 (it ends inside a character at offset"
                f" {len(self.buffer)}); send JSON encoded as UTF-8"
            ) from None
        if len(self.buffer) <= FULL_PARSE_BYTES:
            return parse_body(bytes(self.buffer))
        self._step()
        return self._view()

    # Scanning -------------------------------------------------------------------------------

    def _step(self) -> None:
        if self._done:
            return
        try:
            self._scan.send(None)
        except StopIteration:
            self._done = True

    def _need(self, pos: int) -> Generator[None, None, None]:
        """Wait until the buffer holds byte ``pos``; an error at the end of the body."""
        while pos >= len(self.buffer):
            if self._ended:
                raise _not_json(f"the body ends inside a value (offset {len(self.buffer)})")
            yield _MORE

    def _ws(self, pos: int) -> Generator[None, None, int]:
        """The offset of the next byte that is not whitespace (waits for it)."""
        while True:
            if pos < len(self.buffer) and self.buffer[pos] not in _WS_BYTES:
                return pos  # no whitespace: the usual case, without the regex
            end = _WS.match(self.buffer, pos).end()  # type: ignore[union-attr]
            if end < len(self.buffer):
                return end
            pos = end
            yield from self._need(pos)

    def _byte(self, pos: int, expected: bytes, what: str) -> None:
        if self.buffer[pos] not in expected:
            raise _not_json(f"expected {what} at offset {pos}")

    def _string(self, pos: int) -> Generator[None, None, int]:
        """``pos`` is an opening quote: the offset after the closing one. The next quote is
        found with ``find`` (memchr); after :data:`_ESCAPED_QUOTES_BEFORE_REGEX` escaped
        quotes in one string, with the regex that skips those (text full of quotes)."""
        search = pos + 1
        escaped = 0
        while True:
            if escaped < _ESCAPED_QUOTES_BEFORE_REGEX:
                quote = self.buffer.find(b'"', search)
            else:
                match = _CLOSING_QUOTE.search(self.buffer, search)
                quote = -1 if match is None else match.start()
            if quote < 0:
                search = max(len(self.buffer) - 1, pos + 1)  # a backslash may end the buffer
                yield from self._need(len(self.buffer))
                continue
            before = quote - 1
            while self.buffer[before] == _BACKSLASH:
                before -= 1
            if (quote - 1 - before) % 2 == 0:
                return quote + 1
            escaped += 1
            search = quote + 1

    def _scalar(self, pos: int) -> Generator[None, None, int]:
        """A number or literal at ``pos``: the offset after it."""
        while True:
            match = _SCALAR.match(self.buffer, pos)
            if match is None:
                if len(self.buffer) - pos < 9 and not self._ended:  # "-Infinity" is 9 bytes
                    yield _MORE
                    continue
                raise _not_json(f"unexpected character at offset {pos}")
            if match.end() < len(self.buffer) or self._ended:
                return match.end()
            yield _MORE

    def _value(self, pos: int) -> Generator[None, None, int]:
        """Skip the value at ``pos`` (no whitespace before it): the offset after it."""
        first = self.buffer[pos]
        if first == _QUOTE:
            return (yield from self._string(pos))
        if first not in (_LBRACE, _LBRACKET):
            return (yield from self._scalar(pos))
        closers = [_RBRACE if first == _LBRACE else _RBRACKET]
        search = pos + 1
        while True:
            match = _STRUCTURAL.search(self.buffer, search)
            if match is None:
                search = len(self.buffer)
                yield from self._need(search)
                continue
            at = match.start()
            byte = self.buffer[at]
            if byte == _QUOTE:
                search = yield from self._string(at)
            elif byte in (_LBRACE, _LBRACKET):
                closers.append(_RBRACE if byte == _LBRACE else _RBRACKET)
                search = at + 1
            elif byte != closers.pop():
                raise _not_json(f"unbalanced bracket at offset {at}")
            elif not closers:
                return at + 1
            else:
                search = at + 1

    def _members(self, pos: int, on_member: Any) -> Generator[None, None, int]:
        """An object at ``pos``: for each member ``on_member(name, value_offset)`` (a
        generator returning the offset after the value). Returns the offset after ``}``."""
        pos = yield from self._ws(pos + 1)
        if self.buffer[pos] == _RBRACE:
            return pos + 1
        while True:
            self._byte(pos, b'"', "a member name")
            end = yield from self._string(pos)
            raw = self.buffer[pos + 1 : end - 1]
            name = raw.decode() if _BACKSLASH not in raw else json.loads(self.buffer[pos:end])
            pos = yield from self._ws(end)
            self._byte(pos, b":", "':'")
            pos = yield from self._ws(pos + 1)
            pos = yield from on_member(name, pos)
            pos = yield from self._ws(pos)
            self._byte(pos, b",}", "',' or '}'")
            if self.buffer[pos] == _RBRACE:
                return pos + 1
            pos = yield from self._ws(pos + 1)

    def _top_member(self, name: str, pos: int) -> Generator[None, None, int]:
        if name not in KEY_FIELDS:
            return (yield from self._value(pos))
        if name == "messages" and self.buffer[pos] == _LBRACKET:
            messages: list[_Message] = []
            end = yield from self._messages(pos, messages)
            self.fields[name] = _Field(pos, end, messages)
            return end
        end = yield from self._value(pos)
        self.fields[name] = _Field(pos, end)
        return end

    def _messages(self, pos: int, out: list[_Message]) -> Generator[None, None, int]:
        pos = yield from self._ws(pos + 1)
        if self.buffer[pos] == _RBRACKET:
            return pos + 1
        while True:
            message = _Message(pos)
            if self.buffer[pos] == _LBRACE:

                def member(name: str, at: int, message: _Message = message) -> Any:
                    end = yield from self._value(at)
                    if name == "content":
                        quoted = self.buffer[at] == _QUOTE
                        message.content = (at, end) if quoted else None
                    return end

                pos = yield from self._members(pos, member)
            else:
                pos = yield from self._value(pos)
            message.end = pos
            out.append(message)
            pos = yield from self._ws(pos)
            self._byte(pos, b",]", "',' or ']'")
            if self.buffer[pos] == _RBRACKET:
                return pos + 1
            pos = yield from self._ws(pos + 1)

    def _document(self) -> Generator[None, None, None]:
        pos = yield from self._ws(0)
        if self.buffer[pos] != _LBRACE:
            raise RequestError("the request body must be a JSON object")
        pos = yield from self._members(pos, self._top_member)
        while True:
            end = _WS.match(self.buffer, pos).end()  # type: ignore[union-attr]
            if end < len(self.buffer):
                raise _not_json(f"extra data after the object at offset {end}")
            if self._ended:
                return
            pos = end
            yield _MORE

    # Decoding -------------------------------------------------------------------------------

    def _decode(self, start: int, end: int) -> Any:
        return self._loads(self.buffer[start:end])

    def _loads(self, raw: bytes | bytearray) -> Any:
        try:
            return json.loads(raw)
        except RecursionError:
            raise RequestError("request body is nested too deeply to parse") from None
        except ValueError as error:
            raise _not_json(str(error)) from None

    def _string_prefix(self, start: int, end: int) -> bytes:
        """The JSON string at ``start:end``, cut to its first :func:`raw_limit` bytes at a
        point that splits no escape and no UTF-8 character (whole when it is shorter)."""
        limit = raw_limit(self.key_config)
        if end - start - 2 <= limit:
            return bytes(self.buffer[start:end])
        cut = start + 1 + limit
        while 0x80 <= self.buffer[cut] < 0xC0:  # a UTF-8 continuation byte: inside a character
            cut -= 1
        raw = self.buffer[start + 1 : cut]
        return b'"' + bytes(raw[: _escape_boundary(raw, len(raw))]) + b'"'

    def _message(self, message: _Message) -> Any:
        if message.content is None:
            return self._loads(self.buffer[message.start : message.end])
        start, end = message.content
        text = self._string_prefix(start, end)
        return self._loads(
            bytes(self.buffer[message.start : start]) + text + self.buffer[end : message.end]
        )

    def _chat_messages(self, messages: list[_Message], tools: Any) -> list[Any]:
        """Decoded messages until their rendering covers ``max_chars``; ``{}`` after them."""
        decoded: list[Any] = []
        covered = False
        for message in messages:
            if covered and self.buffer[message.start] == _LBRACE:
                decoded.append({})
                continue
            value = self._message(message)
            decoded.append(value)
            if not covered and isinstance(value, dict):
                try:
                    text, _ = render_chat(decoded, tools, self.key_config.max_chars)
                except (RecursionError, AttributeError, TypeError):
                    continue  # the key function reports it
                covered = len(text) >= self.key_config.max_chars
        return decoded

    def _view(self) -> dict[str, Any]:
        view: dict[str, Any] = {}
        for name in ("model", "tools", "cache_salt"):
            if name in self.fields:
                value = self.fields[name]
                view[name] = self._decode(value.start, value.end)
        prompt = self.fields.get("prompt")
        if prompt is not None:
            if self.buffer[prompt.start] == _QUOTE:
                view["prompt"] = self._loads(self._string_prefix(prompt.start, prompt.end))
            else:
                view["prompt"] = self._decode(prompt.start, prompt.end)
        messages = self.fields.get("messages")
        if messages is not None:
            if messages.messages is None:
                view["messages"] = self._decode(messages.start, messages.end)
            else:
                view["messages"] = self._chat_messages(messages.messages, view.get("tools"))
        return view


def _escape_boundary(raw: bytearray, cut: int) -> int:
    """``cut`` moved back so that ``raw[:cut]`` does not end inside an escape sequence
    (``\\x`` or ``\\uXXXX``): a backslash counts as an escape's start when an even number of
    backslashes precede it."""

    def escape_start(at: int) -> bool:
        if raw[at] != _BACKSLASH:
            return False
        before = at - 1
        while before >= 0 and raw[before] == _BACKSLASH:
            before -= 1
        return (at - 1 - before) % 2 == 0

    for back in range(1, 6):  # an escape that started 1..5 bytes before the cut
        at = cut - back
        if at < 0:
            break
        if escape_start(at) and (back == 1 or raw[at + 1] == ord("u")):
            return at
    return cut
