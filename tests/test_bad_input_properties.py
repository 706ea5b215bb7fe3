"""Property tests: whatever bytes a user or a client sends, ``prefixserving validate``,
``prefixserving render`` and the router's request parsing answer with a clear error and
never raise.

- The CLI is driven through its click commands (``CliRunner``): arbitrary bytes, arbitrary
  YAML data, nesting up to thousands of levels, and valid examples with one value replaced by
  arbitrary data. Each run exits 0 (the file was valid) or 1 with a message naming the file;
  no exception escapes and nothing prints a traceback.
- The renderer's ``tojson`` output loads back as the same string, whatever the characters.
- The router's routed endpoints are called as ASGI apps (no sockets) with arbitrary bodies:
  bytes, JSON data with NaN, huge numbers and lone surrogates, deep nesting, and OpenAI-shaped
  bodies with fields of the wrong type. Each answers 400 with an OpenAI error body or is keyed
  and routed (503 here: the pool has no ready engine); the hot-prefix and hygiene endpoints
  still answer 200 afterwards.

Time is bounded by hypothesis' ``deadline`` per example, set far above the few milliseconds
an example takes, so a busy machine does not fail the test but runaway work (an alias bomb,
quadratic parsing) does.
"""

from __future__ import annotations

import asyncio
import copy
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixserving import constants
from prefixserving.api import documents
from prefixserving.cli import main
from prefixserving.render.environment import yaml_json_dumps
from prefixserving.router.app import Router, build_app
from prefixserving.router.backends import BackendPool
from render_examples import EXAMPLES
from router_support import FirstPolicy

CLI_SETTINGS = settings(
    max_examples=150,
    deadline=timedelta(seconds=10),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
ROUTER_SETTINGS = settings(
    max_examples=300,
    deadline=timedelta(seconds=5),
    suppress_health_check=[HealthCheck.too_slow],
)

# JSON-like data as YAML and JSON parsers produce it, with the awkward values included.
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40)
)
data = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=30,
)


def nested(depth: int, style: str) -> str:
    """A value nested ``depth`` levels deep: flow lists, flow mappings, block mappings (one
    space of indentation per level) or compact block lists (``- - - x``)."""
    if style == "flow-list":
        return "[" * depth + "]" * depth
    if style == "flow-map":
        return "{a: " * depth + "1" + "}" * depth
    if style == "block-map":
        return "".join(" " * i + "a:\n" for i in range(depth))
    return "- " * depth + "x\n"


def assert_clear_outcome(result: Result, source: str) -> None:
    """Exit 0, or exit 1 with a message naming ``source``; never an exception."""
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert "Traceback" not in result.output
    assert result.exit_code in (0, 1), result.output
    if result.exit_code == 1:
        assert result.stderr.strip(), "no message"
        assert source in result.stderr


def run_both(tmp_path: Path, content: bytes) -> list[Result]:
    file = tmp_path / "input.yaml"
    file.write_bytes(content)
    results = []
    for command in ("validate", "render"):
        result = CliRunner().invoke(main, [command, "-f", str(file)])
        assert_clear_outcome(result, str(file))
        if command == "render" and result.exit_code == 1:
            assert result.stdout == ""
        results.append(result)
    return results


@CLI_SETTINGS
@given(content=st.binary(max_size=3000))
def test_arbitrary_bytes(tmp_path: Path, content: bytes) -> None:
    run_both(tmp_path, content)


@CLI_SETTINGS
@given(value=data)
def test_arbitrary_yaml_data(tmp_path: Path, value: Any) -> None:
    for result in run_both(tmp_path, yaml.safe_dump(value).encode()):
        assert result.exit_code == 1  # no such data is a PrefixServing


@CLI_SETTINGS
@given(
    depth=st.integers(min_value=1, max_value=5000),
    style=st.sampled_from(["flow-list", "flow-map", "block-map", "block-list"]),
)
def test_nesting_of_any_depth(tmp_path: Path, depth: int, style: str) -> None:
    if style == "block-map":
        depth = min(depth, 2000)  # its size grows with the square of the depth
    content = nested(depth, style).encode()
    for result in run_both(tmp_path, content):
        assert result.exit_code == 1
        if depth > documents.MAX_DEPTH:
            assert f"nested more than {documents.MAX_DEPTH} levels deep" in result.stderr


def _example_bodies() -> list[dict[str, Any]]:
    return [
        doc
        for path in sorted(EXAMPLES.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside ``value`` (mapping keys and list indexes)."""
    out = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            out += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            out += _paths(child, (*prefix, index))
    return out


EXAMPLE_BODIES = _example_bodies()


@st.composite
def mutated_examples(draw: st.DrawFn) -> dict[str, Any]:
    """A valid example with the value at one path replaced by arbitrary data."""
    body = copy.deepcopy(draw(st.sampled_from(EXAMPLE_BODIES)))
    path = draw(st.sampled_from(_paths(body)[1:]))
    parent = body
    for part in path[:-1]:
        parent = parent[part]
    parent[path[-1]] = draw(data)
    return body


@CLI_SETTINGS
@given(body=mutated_examples())
def test_valid_examples_with_one_value_replaced(tmp_path: Path, body: dict[str, Any]) -> None:
    run_both(tmp_path, yaml.safe_dump(body, allow_unicode=True).encode())


@settings(max_examples=300, deadline=timedelta(seconds=5))
@given(text=st.text(st.characters(codec="utf-8"), max_size=200))
def test_template_values_survive_json_and_yaml(text: str) -> None:
    """Every string a resource can hold comes back unchanged from ``tojson`` through the YAML
    loader the renderer uses (both libyaml's and PyYAML's)."""
    dumped = yaml_json_dumps({"value": [text]}, sort_keys=True)
    for loader in (yaml.SafeLoader, getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
        assert yaml.load(dumped, Loader=loader) == {"value": [text]}


# --- The router ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def router() -> Router:
    """A router whose engines' DNS name was never resolved, so keyed requests answer 503."""

    async def unresolved(host: str, port: int) -> list[str]:
        raise LookupError(host)

    pool = BackendPool(dns=("engines.test", 8000), resolver=unresolved)
    assert pool.healthy() == ()
    return Router(pool=pool, policy=FirstPolicy())


async def call(app: Any, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
    """One request through the ASGI app: (status, body)."""
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    return start["status"], b"".join(m.get("body", b"") for m in sent[1:])


def assert_routed_or_refused(router: Router, path: str, raw: bytes) -> None:
    app = build_app(router)

    async def exchange() -> None:
        status, answer = await call(app, "POST", path, raw)
        assert status in (400, 503), (status, answer)
        error = json.loads(answer)["error"]
        assert error["message"] and error["code"] == status
        for side_path in (constants.ROUTER_HOT_PREFIXES_PATH, constants.ROUTER_HYGIENE_PATH):
            side_status, side_answer = await call(app, "GET", side_path)
            assert side_status == 200, side_answer

    asyncio.run(exchange())


ROUTED = st.sampled_from(["/v1/completions", "/v1/chat/completions"])
# Text drawn half from characters that break naive code: lone surrogates (JSON can carry them
# as escapes, Unicode has no such characters), a character beyond U+FFFF, NUL, a line
# separator, a byte-order mark; half from all of Unicode.
tricky = st.sampled_from(["\ud800", "\udfff", "\U0001f642", "\x00", "\u2028", "\ufeff"])
# (st.text would drop the surrogates.)
any_text = st.lists(tricky | st.characters(codec=None, exclude_categories=()), max_size=300).map(
    "".join
)
awkward = st.recursive(
    scalars | any_text,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(any_text, children, max_size=4)
    ),
    max_leaves=20,
)


def mostly(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``good`` three times in four, so most bodies get past the first check (``one_of``
    would pick each alternative equally often)."""
    return st.sampled_from([good, good, good, bad]).flatmap(lambda strategy: strategy)


models = mostly(st.sampled_from(["m", "adapter-1"]), awkward)
token_ids = st.lists(st.integers(-(2**70), 2**70), max_size=80)
salts = st.fixed_dictionaries({}, optional={"cache_salt": mostly(any_text, awkward)})
message = st.fixed_dictionaries(
    {"role": mostly(st.sampled_from(["system", "user"]), awkward), "content": any_text | awkward},
    optional={"name": awkward, "tool_calls": awkward, "extra": awkward},
)
completion_bodies = st.fixed_dictionaries(
    {"model": models, "prompt": mostly(any_text | token_ids, awkward)},
    optional={"extra": awkward},
)
chat_bodies = st.fixed_dictionaries(
    {"model": models, "messages": mostly(st.lists(mostly(message, awkward), max_size=4), awkward)},
    optional={"tools": awkward, "extra": awkward},
)
# OpenAI-shaped bodies (sent to either endpoint) and anything else JSON can hold.
openai_bodies = st.one_of(
    st.builds(lambda body, salt: body | salt, completion_bodies | chat_bodies, salts), awkward
)


@ROUTER_SETTINGS
@given(path=ROUTED, raw=st.binary(max_size=2000))
def test_router_arbitrary_bytes(router: Router, path: str, raw: bytes) -> None:
    assert_routed_or_refused(router, path, raw)


@ROUTER_SETTINGS
@given(path=ROUTED, body=openai_bodies)
def test_router_bodies_with_fields_of_any_type(router: Router, path: str, body: Any) -> None:
    # Twice: a body seen twice becomes a hot prefix the endpoint must be able to answer with.
    raw = json.dumps(body).encode()  # escapes lone surrogates, writes NaN and Infinity
    assert_routed_or_refused(router, path, raw)
    assert_routed_or_refused(router, path, raw)


@ROUTER_SETTINGS
@given(
    path=ROUTED,
    depth=st.integers(min_value=1, max_value=200_000),
    field=st.sampled_from(["prompt", "messages", "content", "tools", "extra"]),
)
def test_router_nesting_of_any_depth(router: Router, path: str, depth: int, field: str) -> None:
    deep = "[" * depth + "]" * depth
    if field == "content":
        text = f'{{"model": "m", "messages": [{{"role": "user", "content": {deep}}}]}}'
    else:
        text = f'{{"model": "m", "prompt": "x", "messages": [], "{field}": {deep}}}'
    assert_routed_or_refused(router, path, text.encode())
