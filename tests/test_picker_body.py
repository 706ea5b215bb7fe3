"""The endpoint picker's body reader (router.streamed_body) keys every request exactly as the
HTTP router does (prefix_hashing.parse_body, then the key function), however the body is cut
into chunks, while decoding only the key's fields of a large body; it reports bad bodies with
the router's messages."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixserving.router import prefix_hashing as ph
from prefixserving.router import streamed_body
from prefixserving.router.hot import HotPrefixes
from prefixserving.router.streamed_body import BodyTooLarge, StreamedBody

# A small key (4 blocks of 16 characters) so that generated strings run past it and the
# reader's cut of long strings is exercised.
SMALL = ph.KeyConfig(block_chars=16, prefix_blocks=4, base_model="base")
ALPHABET = 'ab \n"\\/\té😀\u2028\x00'
TEXT = st.text(alphabet=ALPHABET, max_size=20) | st.text(
    alphabet=ALPHABET, min_size=60, max_size=300
)


def key_of(raw: bytes, function: Any, config: ph.KeyConfig) -> tuple[Any, ...]:
    """The HTTP router's key of ``raw``, or the error message."""
    try:
        key = function(ph.parse_body(raw), config)
    except ph.RequestError as error:
        return ("error", str(error).split(":")[0], error.param)
    return (key.blocks, key.kind, key.model, key.salted, key.first_block)


def streamed_key(
    raw: bytes, function: Any, config: ph.KeyConfig, cuts: list[int]
) -> tuple[Any, ...]:
    body = StreamedBody(config, max_bytes=1 << 30)
    try:
        start = 0
        for cut in [*sorted(c % (len(raw) + 1) for c in cuts), len(raw)]:
            body.feed(raw[start:cut])
            start = max(start, cut)
        key = function(body.finish(), config)
    except ph.RequestError as error:
        return ("error", str(error).split(":")[0], error.param)
    return (key.blocks, key.kind, key.model, key.salted, key.first_block)


message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant"]), "content": TEXT},
    optional={"name": st.sampled_from(["ann", "bob"])},
) | st.fixed_dictionaries(
    {
        "role": st.just("user"),
        "content": st.lists(
            st.fixed_dictionaries({"type": st.just("text"), "text": TEXT})
            | st.fixed_dictionaries(
                {"type": st.just("image_url"), "image_url": st.fixed_dictionaries({"url": TEXT})}
            ),
            max_size=3,
        ),
    }
)
OPTIONAL_FIELDS = {
    "tools": st.lists(st.fixed_dictionaries({"type": st.just("function")}), max_size=2),
    "cache_salt": TEXT,
    "max_tokens": st.integers(1, 100),
    "stream": st.booleans(),
}
MODEL = st.sampled_from(["base", "lora-a"])
CHAT_FIELDS = st.fixed_dictionaries(
    {"model": MODEL, "messages": st.lists(message, min_size=1, max_size=5)},
    optional=OPTIONAL_FIELDS,
)
COMPLETION_FIELDS = st.fixed_dictionaries(
    {
        "model": MODEL,
        "prompt": TEXT | st.lists(st.integers(-(2**63), 2**63 - 1), max_size=80) | st.lists(TEXT),
    },
    optional=OPTIONAL_FIELDS,
)


@st.composite
def bodies(draw: st.DrawFn, fields: st.SearchStrategy[dict[str, Any]]) -> bytes:
    """A JSON object in any field order, with ASCII or raw Unicode, sometimes a duplicate key
    (the last one wins, as in Python's parser) or a field missing."""
    items = list(draw(fields).items())
    items = draw(st.permutations(items))
    if draw(st.integers(0, 9)) == 0:
        items.pop(draw(st.integers(0, len(items) - 1)))
    ascii_only = draw(st.booleans())
    parts = [f"{json.dumps(k)}: {json.dumps(v, ensure_ascii=ascii_only)}" for k, v in items]
    if draw(st.integers(0, 5)) == 0:
        parts.append('"model" : "lora-b"')
    spacing = draw(st.sampled_from([",", " ,\n ", ",\t"]))
    return ("{" + spacing.join(parts) + "}").encode()


@pytest.fixture
def scan_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bodies of any size go through the scanner, not the whole-body parse."""
    monkeypatch.setattr(streamed_body, "FULL_PARSE_BYTES", 0)


@pytest.mark.usefixtures("scan_everything")
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=bodies(CHAT_FIELDS), cuts=st.lists(st.integers(0, 10_000), max_size=6))
def test_the_scanned_chat_key_is_the_router_key_however_the_body_is_chunked(
    raw: bytes, cuts: list[int]
) -> None:
    assert streamed_key(raw, ph.chat_key, SMALL, cuts) == key_of(raw, ph.chat_key, SMALL)


@pytest.mark.usefixtures("scan_everything")
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=bodies(COMPLETION_FIELDS), cuts=st.lists(st.integers(0, 10_000), max_size=6))
def test_the_scanned_completion_key_is_the_router_key_however_the_body_is_chunked(
    raw: bytes, cuts: list[int]
) -> None:
    expected = key_of(raw, ph.completion_key, SMALL)
    assert streamed_key(raw, ph.completion_key, SMALL, cuts) == expected


@pytest.mark.usefixtures("scan_everything")
@settings(max_examples=200, deadline=None)
@given(raw=st.binary(max_size=60) | bodies(CHAT_FIELDS).map(lambda b: b[: len(b) // 2]))
def test_broken_bodies_are_refused_like_the_router_does(raw: bytes) -> None:
    """Truncated JSON and random bytes: an error whenever the router gives one (the same kind
    of message), never an exception of another type."""
    expected = key_of(raw, ph.chat_key, SMALL)
    got = streamed_key(raw, ph.chat_key, SMALL, [len(raw) // 3])
    if expected[0] == "error":
        assert got[0] == "error"
    else:
        assert got == expected


def long_chat(chars: int) -> bytes:
    document = ('a "quoted" word, naïve café — \\ and more\n' * (chars // 40 + 1))[:chars]
    return json.dumps(
        {
            "messages": [
                {"role": "system", "content": "You review documents."},
                {"role": "user", "content": document},
            ],
            "model": "base",
            "max_tokens": 8,
            "tools": [{"type": "function", "function": {"name": "lookup"}}],
            "cache_salt": "tenant-1",
        }
    ).encode()


def test_a_large_body_is_scanned_and_only_its_leading_content_decoded() -> None:
    raw = long_chat(200_000)
    config = ph.KeyConfig(base_model="base")
    body = StreamedBody(config, max_bytes=1 << 24)
    for start in range(0, len(raw), 32_768):
        body.feed(raw[start : start + 32_768])
    view = body.finish()
    assert set(body.fields) == {"messages", "model", "tools", "cache_salt"}
    content = view["messages"][1]["content"]
    assert config.max_chars <= len(content) < 200_000 / 4
    assert ph.chat_key(view, config) == ph.chat_key(ph.parse_body(raw), config)


def test_hot_prefixes_record_the_same_replay_body_from_the_view() -> None:
    raw = long_chat(200_000)
    config = ph.KeyConfig(base_model="base", prefix_blocks=8)
    body = StreamedBody(config, max_bytes=1 << 24)
    body.feed(raw)
    view = body.finish()
    full = ph.parse_body(raw)
    del view["cache_salt"], full["cache_salt"]  # salted requests are never recorded
    tables = []
    for source in (view, full):
        hot = HotPrefixes(config)
        for _ in range(2):
            hot.observe(ph.chat_key(source, config), source)
        tables.append([row.to_json() for row in hot.top()])
    assert tables[0] == tables[1] and tables[0]


def test_small_bodies_are_parsed_whole_as_the_router_does() -> None:
    raw = long_chat(2_000)
    body = StreamedBody(ph.KeyConfig(), max_bytes=1 << 24)
    body.feed(raw)
    assert body.fields == {}  # nothing scanned below FULL_PARSE_BYTES
    assert body.finish() == ph.parse_body(raw)


def test_a_bad_byte_is_reported_with_its_offset_as_the_router_reports_it() -> None:
    raw = b'{"model": "base", "prompt": "caf\xc3' + b'\xff"}'
    with pytest.raises(ph.RequestError) as router_error:
        ph.parse_body(raw)
    body = StreamedBody(ph.KeyConfig(), max_bytes=1 << 20)
    cut = raw.index(b"\xc3") + 1
    body.feed(raw[:cut])  # ends inside the two-byte character: not an error yet
    with pytest.raises(ph.RequestError) as picker_error:
        body.feed(raw[cut:])
    assert str(picker_error.value) == str(router_error.value)
    assert f"byte 0xc3 at offset {cut - 1}" in str(picker_error.value)


@pytest.mark.usefixtures("scan_everything")
@pytest.mark.parametrize(
    ("first_chunk", "message"),
    [
        (b"[1, 2", "the request body must be a JSON object"),
        (b'{"model": "m", "prompt": "x"} {', "extra data after the object"),
        (b'{"model" "m"', "expected ':'"),
        (b'{"messages": [{"role": "user"} {', "expected ',' or ']'"),
        (b'{"tools": [1}', "unbalanced bracket"),
    ],
)
def test_grammar_errors_are_reported_as_soon_as_the_chunk_shows_them(
    first_chunk: bytes, message: str
) -> None:
    body = StreamedBody(ph.KeyConfig(), max_bytes=1 << 20)
    with pytest.raises(ph.RequestError, match=message):
        body.feed(first_chunk)


def test_a_body_over_the_limit_stops_at_the_chunk_that_crosses_it() -> None:
    body = StreamedBody(ph.KeyConfig(), max_bytes=100)
    body.feed(b" " * 60)
    with pytest.raises(BodyTooLarge, match="over the limit of 100 bytes"):
        body.feed(b" " * 41)


@pytest.mark.usefixtures("scan_everything")
def test_a_body_that_ends_inside_a_value_is_not_json() -> None:
    body = StreamedBody(ph.KeyConfig(), max_bytes=1 << 20)
    body.feed(b'{"model": "m", "prompt": "unfinished')
    with pytest.raises(ph.RequestError, match="ends inside a value"):
        body.finish()
