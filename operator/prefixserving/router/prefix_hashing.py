"""Prefix hashing: a request body -> its :class:`PrefixKey`, chained hashes over fixed-size
blocks of its leading content (the only place the router reads a body).

**Algorithm**

1. Pick the leading content of the request:

   - ``/v1/chat/completions``: the ``tools`` (if any) and then the ``messages`` in order,
     rendered canonically (:func:`render_chat`): ``<|role|>`` (plus ``:name``), a newline, the
     content, a newline. Text parts of list content are concatenated; any other part (an
     image, a tool call) is its JSON with sorted keys, so equal parts render equally.
   - ``/v1/completions``: the prompt; a text prompt is cut into blocks of ``block_chars``
     characters, a token-id prompt into blocks of ``block_tokens`` ids. A batch prompt is
     keyed by its first element.

2. Cut it into full blocks, at most ``prefix_blocks`` of them. A partial trailing block is
   not hashed (vLLM caches only full blocks too), except that content shorter than one block
   is one block, so short repeated prompts still have a key.

3. Chain the hashes: ``h[-1] = H(namespace)``, ``h[i] = H(h[i-1] || block[i])`` with ``H`` =
   BLAKE2b, 8-byte digest. The namespace holds the content kind (chat, text, tokens), the LoRA
   adapter (the ``model`` field, unless it is the base model given as ``base_model``) and
   ``cache_salt``. So requests for different adapters or salts never share a block hash,
   like vLLM's own block hashes, which carry the adapter and salt as extra keys.

Two requests share their first ``k`` block hashes exactly when they share the namespace and
the first ``k`` full blocks of content. The hash is stable across processes and machines
(never Python's salted ``hash()``), which lets router replicas agree without talking.

**Parameters**

- ``block_chars`` (default 128): characters per block of text and rendered chat.
- ``block_tokens`` (default ``block_chars // 4``, i.e. 32): ids per block of a token prompt
  (about four characters per token).
- ``prefix_blocks`` (default 32): depth; the key covers the first ``block_chars *
  prefix_blocks`` characters (4 KiB) or ``block_tokens * prefix_blocks`` ids (1,024).

**Cost**: O(``prefix_blocks * block_chars``) per request: at most ``prefix_blocks`` BLAKE2b
digests of one block each. Rendering stops once the depth is covered and only the hashed
token ids are read, so a long conversation or prompt costs no more than a short one.
"""

from __future__ import annotations

import enum
import functools
import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from hashlib import blake2b
from typing import Any

from prefixserving import constants

DEFAULT_BLOCK_CHARS = constants.ROUTER_BLOCK_CHARS
DEFAULT_PREFIX_BLOCKS = constants.ROUTER_PREFIX_BLOCKS
CHARS_PER_TOKEN = 4

_DIGEST_BYTES = 8
_KEY_VERSION = b"prefixserving-key-v1"


class ContentKind(enum.StrEnum):
    """What the leading content is; part of the namespace."""

    CHAT = "chat"
    TEXT = "text"
    TOKENS = "tokens"


class RequestError(ValueError):
    """The request body cannot be keyed; the message is shown to the client, ``param`` names
    the offending field (OpenAI error body)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def parse_body(raw: bytes) -> dict[str, Any]:
    """The JSON object of a request body, or :class:`RequestError` when it is not UTF-8
    (RFC 8259 requires it between systems), not JSON (integers over 4,300 digits included),
    nested deeper than the JSON parser goes (about 1,000 levels: it raises RecursionError,
    bounded by the interpreter's limit), or not an object. Cost: one decode and one parse
    (C code), O(bytes)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RequestError(
            f"request body is not UTF-8 (byte 0x{raw[error.start]:02x} at offset"
            f" {error.start}); send JSON encoded as UTF-8"
        ) from None
    try:
        body = json.loads(text)
    except RecursionError:
        raise RequestError("request body is nested too deeply to parse") from None
    except ValueError as error:
        raise RequestError(f"request body is not valid JSON: {error}") from None
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    return body


def _utf8(text: str, param: str) -> bytes:
    """``text`` as UTF-8; a lone surrogate (JSON allows the escape ``\\ud800``, Unicode has
    no such character) is the client's error."""
    try:
        return text.encode()
    except UnicodeEncodeError as error:
        code = ord(text[error.start])
        raise RequestError(
            f"'{param}' holds a lone UTF-16 surrogate (\\u{code:04x}); send valid Unicode",
            param=param,
        ) from None


@dataclass(frozen=True, slots=True)
class KeyConfig:
    """Block size and depth of prefix keys (see the module docstring)."""

    block_chars: int = DEFAULT_BLOCK_CHARS
    prefix_blocks: int = DEFAULT_PREFIX_BLOCKS
    base_model: str | None = None

    def __post_init__(self) -> None:
        if self.block_chars < CHARS_PER_TOKEN:
            raise ValueError(f"block_chars must be at least {CHARS_PER_TOKEN}")
        if self.prefix_blocks < 1:
            raise ValueError("prefix_blocks must be at least 1")

    @property
    def block_tokens(self) -> int:
        return self.block_chars // CHARS_PER_TOKEN

    @property
    def max_chars(self) -> int:
        return self.block_chars * self.prefix_blocks

    @property
    def max_tokens(self) -> int:
        return self.block_tokens * self.prefix_blocks


@dataclass(frozen=True, slots=True)
class PrefixKey:
    """The key of one request.

    ``blocks``: chained block hashes, first block first. ``kind``: the content kind.
    ``model``: the request's ``model`` field. ``salted``: the request carried ``cache_salt``.
    ``first_block``: the first block's content as text (token ids space-separated), for the
    prefix-hygiene diagnosis; empty for empty content.
    """

    blocks: tuple[int, ...]
    kind: ContentKind
    model: str
    salted: bool
    first_block: str


def _digest(data: bytes) -> bytes:
    return blake2b(data, digest_size=_DIGEST_BYTES).digest()


@functools.lru_cache(maxsize=4096)
def _namespace(kind: ContentKind, adapter: str | None, salt: str | None) -> bytes:
    """The seed of a key's chain (cached: a few adapters and salts recur on every request)."""
    parts = [_KEY_VERSION, kind.value.encode()]
    parts.append(b"a:" + adapter.encode() if adapter is not None else b"-")
    parts.append(b"s:" + salt.encode() if salt is not None else b"-")
    return _digest(b"\0".join(parts))


def chain_hashes(seed: bytes, blocks: Sequence[bytes]) -> tuple[int, ...]:
    """``h[i] = BLAKE2b(h[i-1] || blocks[i])`` starting from ``seed``, as unsigned ints."""
    out: list[int] = []
    previous = seed
    for block in blocks:
        previous = _digest(previous + block)
        out.append(int.from_bytes(previous, "big"))
    return tuple(out)


def _cut(length: int, size: int, depth: int) -> list[tuple[int, int]]:
    """Spans of full blocks (or one short block when length < size), at most ``depth``."""
    if length == 0:
        return []
    if length < size:
        return [(0, length)]
    count = min(length // size, depth)
    return [(i * size, (i + 1) * size) for i in range(count)]


# Deepest nesting of lists and objects in the fields a chat key renders ('tools', a message's
# 'content' and 'tool_calls') that it accepts; other fields are the engine's to judge. The
# canonical rendering (and a hot prefix's replay body) recurses once per level; a fixed bound,
# checked without recursion, keeps that far below the interpreter's limit wherever the
# rendering runs, instead of an answer that depends on how deep the caller's stack is.
MAX_NESTING = 128


def nests_deeper_than(value: Any, limit: int) -> bool:
    """Whether the lists and objects in ``value`` (parsed JSON) nest more than ``limit``
    levels (``value`` itself, if a container, is level 1). Iterative; O(containers)."""
    stack: list[tuple[Any, int]] = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        container, depth = stack.pop()
        if depth > limit:
            return True
        children = container.values() if isinstance(container, dict) else container
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def _canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _render_content(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text":
                pieces.append(str(part.get("text", "")))
            else:
                pieces.append(_canonical_json(part))
        return "".join(pieces)
    return _canonical_json(content)


def _message_head(message: Mapping[str, Any]) -> str:
    name = message.get("name")
    return f"<|{message.get('role', '')}|>" + (f":{name}" if name is not None else "") + "\n"


def _render_message(message: Mapping[str, Any]) -> str:
    head = _message_head(message)
    body = _render_content(message.get("content"))
    tool_calls = message.get("tool_calls")
    if tool_calls:
        body += _canonical_json(tool_calls)
    return head + body + "\n"


def render_chat(
    messages: Sequence[Mapping[str, Any]], tools: Any = None, max_chars: int | None = None
) -> tuple[str, list[int]]:
    """Canonical text of ``tools`` and ``messages``, stopping after ``max_chars`` characters.

    Returns the text and the offset where each rendered message starts (the tools header, if
    any, comes before the first message).
    """
    pieces: list[str] = []
    starts: list[int] = []
    length = 0
    if tools:
        header = "<|tools|>\n" + _canonical_json(tools) + "\n"
        pieces.append(header)
        length += len(header)
    for message in messages:
        if max_chars is not None and length >= max_chars:
            break
        rendered = _render_message(message)
        starts.append(length)
        pieces.append(rendered)
        length += len(rendered)
    text = "".join(pieces)
    return (text if max_chars is None else text[:max_chars]), starts


def _pack_tokens(ids: Sequence[Any]) -> bytes:
    try:
        return struct.pack(f"<{len(ids)}q", *ids)
    except struct.error as error:
        raise RequestError("token ids must be integers", param="prompt") from error


def first_prompt(prompt: Any) -> str | list[Any]:
    """The prompt to key: text or token ids (the first element of a batch). Only the type of
    the first element is checked here; the ids that are hashed are checked when packed, the
    rest is the engine's to validate (so a long prompt costs nothing extra)."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        first = prompt[0] if prompt else 0
        if isinstance(first, int):
            return prompt
        if isinstance(first, str):
            return first
        if isinstance(first, list) and (not first or isinstance(first[0], int)):
            return first
    raise RequestError(
        "'prompt' must be a string, a list of token ids, or a list of either", param="prompt"
    )


def _adapter(model: str, config: KeyConfig) -> str | None:
    return None if model == config.base_model else model


def _salt(body: Mapping[str, Any]) -> str | None:
    salt = body.get("cache_salt")
    if salt is None:
        return None
    if not isinstance(salt, str):
        raise RequestError("'cache_salt' must be a string", param="cache_salt")
    _utf8(salt, "cache_salt")
    return salt


def request_model(body: Any) -> str:
    """The ``model`` field, or :class:`RequestError` when the body is not an object or the
    field is missing or empty."""
    if not isinstance(body, Mapping):
        raise RequestError("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError("'model' is required and must be a non-empty string", param="model")
    _utf8(model, "model")
    return model


def chat_key(body: Mapping[str, Any], config: KeyConfig) -> PrefixKey:
    """The key of a ``/v1/chat/completions`` body."""
    model = request_model(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, Mapping) for m in messages):
        raise RequestError("'messages' must be a list of message objects", param="messages")
    salt = _salt(body)
    tools = body.get("tools")
    rendered = [tools] + [m.get(f) for m in messages for f in ("content", "tool_calls")]
    if any(nests_deeper_than(value, MAX_NESTING) for value in rendered):
        raise RequestError(
            "'tools' or a message's 'content' or 'tool_calls' nests lists and objects more"
            f" than {MAX_NESTING} levels deep; flatten the deepest part",
            "messages",
        )
    text, _ = render_chat(messages, tools, config.max_chars)
    spans = _cut(len(text), config.block_chars, config.prefix_blocks)
    seed = _namespace(ContentKind.CHAT, _adapter(model, config), salt)
    blocks = chain_hashes(seed, [_utf8(text[a:b], "messages") for a, b in spans])
    first = text[spans[0][0] : spans[0][1]] if spans else ""
    return PrefixKey(blocks, ContentKind.CHAT, model, salt is not None, first)


def completion_key(body: Mapping[str, Any], config: KeyConfig) -> PrefixKey:
    """The key of a ``/v1/completions`` body (text or token-id prompt)."""
    model = request_model(body)
    if "prompt" not in body:
        raise RequestError("'prompt' is required", param="prompt")
    prompt = first_prompt(body["prompt"])
    salt = _salt(body)
    adapter = _adapter(model, config)
    if isinstance(prompt, str):
        spans = _cut(min(len(prompt), config.max_chars), config.block_chars, config.prefix_blocks)
        seed = _namespace(ContentKind.TEXT, adapter, salt)
        blocks = chain_hashes(seed, [_utf8(prompt[a:b], "prompt") for a, b in spans])
        first = prompt[spans[0][0] : spans[0][1]] if spans else ""
        return PrefixKey(blocks, ContentKind.TEXT, model, salt is not None, first)
    spans = _cut(min(len(prompt), config.max_tokens), config.block_tokens, config.prefix_blocks)
    seed = _namespace(ContentKind.TOKENS, adapter, salt)
    blocks = chain_hashes(seed, [_pack_tokens(prompt[a:b]) for a, b in spans])
    first = " ".join(map(str, prompt[spans[0][0] : spans[0][1]])) if spans else ""
    return PrefixKey(blocks, ContentKind.TOKENS, model, salt is not None, first)


def replay_body(body: Mapping[str, Any], key: PrefixKey, depth: int, config: KeyConfig) -> dict:
    """A request body that carries only the leading content of ``key``'s first ``depth``
    blocks, without sampling parameters: what a warm-up sends to fill a cache with the prefix.

    Chat: the tools and the messages that start within the covered characters, the last one's
    string content cut at the boundary. Completions: the prompt cut at the boundary.
    """
    out: dict[str, Any] = {"model": key.model}
    if key.kind is ContentKind.CHAT:
        limit = depth * config.block_chars
        tools = body.get("tools")
        _, starts = render_chat(body["messages"], tools, limit)
        messages = []
        for message, start in zip(body["messages"], starts, strict=False):
            if start >= limit:
                break
            kept = dict(message)
            room = limit - start - len(_message_head(message))
            if isinstance(kept.get("content"), str) and len(kept["content"]) > room:
                kept["content"] = kept["content"][: max(room, 0)]
            messages.append(kept)
        if tools:
            out["tools"] = tools
        out["messages"] = messages
        return out
    prompt = first_prompt(body["prompt"])
    size = config.block_chars if key.kind is ContentKind.TEXT else config.block_tokens
    out["prompt"] = prompt[: depth * size]
    return out
