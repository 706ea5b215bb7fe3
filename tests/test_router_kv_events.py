"""``--kv-events`` in the router: per request the policy sees, per engine, the leading blocks
that engine holds (``RoutingContext.cached``), computed from the body with the engines'
tokenizer; without the mode it sees none. The metrics expose each followed engine. The
tokenizer's bound on long prompts keeps exactly the tokens a full encoding starts with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from prefixserving.router.app import Router
from prefixserving.router.backends import BackendPool
from prefixserving.router.kv_events.hashing import BlockHasher
from prefixserving.router.kv_events.index import KvIndex
from prefixserving.router.kv_events.lookup import CachedBlocks
from prefixserving.router.kv_events.subscriber import KvEventSubscriptions
from prefixserving.router.kv_events.tokens import RequestTokenizer
from prefixserving.router.policies.base import Decision, DecisionReason, RoutingContext
from prefixserving.router.prefix_hashing import KeyConfig, chat_key, completion_key
from prefixserving_lab.runners.stack.engines import write_model_dir
from router_support import FirstPolicy

A, B = "http://10.0.0.1:8000", "http://10.0.0.2:8000"
BLOCK_SIZE = 16
WORDS = " ".join(f"word{i % 37} alpha beta gamma" for i in range(400))


class RecordingPolicy(FirstPolicy):
    def __init__(self) -> None:
        self.contexts: list[RoutingContext] = []

    def select(self, ctx: RoutingContext) -> Decision:
        self.contexts.append(ctx)
        return Decision(sorted(ctx.backends)[0], DecisionReason.AFFINITY)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> RequestTokenizer:
    folder = write_model_dir(tmp_path_factory.mktemp("model"))
    return RequestTokenizer(str(folder), max_tokens=BLOCK_SIZE * 8)


def test_the_tokenizer_is_loaded_at_the_engines_revision(monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers

    loaded: list[tuple[str, dict[str, Any]]] = []

    def from_pretrained(name: str, **options: Any) -> object:
        loaded.append((name, options))
        return object()

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", from_pretrained)
    RequestTokenizer("Qwen/Qwen3-8B", BLOCK_SIZE, revision="0f1e2d3")
    assert loaded == [("Qwen/Qwen3-8B", {"revision": "0f1e2d3"})]


def _router(policy: RecordingPolicy, lookup: CachedBlocks | None) -> Router:
    pool = BackendPool(static=(A, B))
    events = None if lookup is None else (KvEventSubscriptions(lookup.index), lookup)
    return Router(pool=pool, policy=policy, key_config=KeyConfig(base_model="m"), kv_events=events)


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m", "prompt": WORDS},
        {"model": "m", "prompt": list(range(200))},
        {"model": "m", "messages": [{"role": "system", "content": WORDS}]},
    ],
    ids=["text", "token-ids", "chat"],
)
def test_the_policy_sees_the_engines_cached_depth(
    tokenizer: RequestTokenizer, body: dict[str, Any]
) -> None:
    index = KvIndex()
    lookup = CachedBlocks(index, BlockHasher(BLOCK_SIZE), tokenizer, base_model="m")
    keys = lookup.keys(body)
    assert len(keys) == 8  # max_tokens / BLOCK_SIZE: the bound
    index.engine(A).store(keys[:3])
    index.engine(B).store(keys)
    policy = RecordingPolicy()
    router = _router(policy, lookup)
    key = (chat_key if "messages" in body else completion_key)(body, router.key_config)
    router.decide(key, body, (A, B))
    assert policy.contexts[-1].cached == {A: 3, B: 8}

    adapter = {**body, "model": "an-adapter"}  # keyed by its path: the router cannot hash it
    router.decide(key, adapter, (A, B))
    assert policy.contexts[-1].cached == {}

    metrics = generate_latest(router.metrics.registry).decode()
    assert "prefixserving_router_kv_events_blocks" in metrics  # exposed (no feed yet: empty)


def test_prefix_affinity_follows_the_engine_that_holds_the_request(
    tokenizer: RequestTokenizer,
) -> None:
    """The shipped policy behind the router: the request goes to the engine whose events
    say it holds the request's prefix, not to its rendezvous first choice; an engine that
    holds nothing of it is listed with 0."""
    from prefixserving.router.policies.prefix_affinity import PrefixAffinityPolicy

    index = KvIndex()
    lookup = CachedBlocks(index, BlockHasher(BLOCK_SIZE), tokenizer, base_model="m")
    pool = BackendPool(static=(A, B))
    router = Router(
        pool=pool,
        policy=PrefixAffinityPolicy(),
        key_config=KeyConfig(base_model="m"),
        kv_events=(KvEventSubscriptions(index), lookup),
    )
    body = {"model": "m", "prompt": WORDS}
    key = completion_key(body, router.key_config)
    first = router.decide(key, body, (A, B))
    assert first is not None
    other = B if first.backend == A else A
    index.engine(first.backend).store([])  # followed, holding nothing of the request
    index.engine(other).store(lookup.keys(body))
    decision = router.decide(key, body, (A, B))
    assert decision is not None
    assert (decision.backend, decision.reason) == (other, DecisionReason.CACHED)
    assert lookup.depths(lookup.keys(body), (A, B)) == {first.backend: 0, other: 8}


def test_without_the_mode_the_policy_sees_no_cached_blocks() -> None:
    policy = RecordingPolicy()
    router = _router(policy, None)
    body = {"model": "m", "prompt": WORDS}
    router.decide(completion_key(body, router.key_config), body, (A, B))
    assert policy.contexts[-1].cached == {}
    assert "kv_events" not in generate_latest(router.metrics.registry).decode()


@pytest.mark.parametrize(
    ("text", "at_least"),
    [
        (WORDS * 3, BLOCK_SIZE * 8),  # dense: the token bound cuts
        # the character bound, cutting "tok29" to "tok2": a different last token
        (" " * 18 + "".join(f"tok{i}" + " " * 30 for i in range(400)), BLOCK_SIZE * 2),
        ("".join(f"tok{i}" + " " * 300 for i in range(40)), 5),  # ...in a run of spaces
    ],
    ids=["dense", "sparse", "spaces-at-the-cut"],
)
def test_a_long_prompt_is_cut_to_the_tokens_a_full_encoding_starts_with(
    tokenizer: RequestTokenizer, text: str, at_least: int
) -> None:
    full = tokenizer.tokenizer(text, add_special_tokens=True)["input_ids"]
    cut = tokenizer.encode(text, add_special_tokens=True)
    assert len(cut) >= at_least
    assert cut == full[: len(cut)]  # no word cut in two, no end marker appended


def test_images_give_no_tokens(tokenizer: RequestTokenizer, tmp_path: Path) -> None:
    image = {"type": "image_url", "image_url": {"url": "http://x/y.png"}}
    body = {"model": "m", "messages": [{"role": "user", "content": [image]}]}
    assert tokenizer.chat(body) is None


@pytest.mark.parametrize(
    "body",
    [{"model": "m", "messages": ["not a message"]}, {"model": "m", "prompt": []}],
    ids=["bad-message", "empty-prompt"],
)
def test_bodies_the_tokenizer_cannot_take_give_no_keys(
    tokenizer: RequestTokenizer, body: dict[str, Any]
) -> None:
    lookup = CachedBlocks(KvIndex(), BlockHasher(BLOCK_SIZE), tokenizer)
    assert lookup.keys(body) == ()
