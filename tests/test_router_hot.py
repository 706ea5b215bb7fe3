"""Hot prefixes: bounded top-K with decay, replay bodies, and what a new member would own."""

from __future__ import annotations

from collections.abc import Sequence

from prefixserving.router.hot import HotPrefixes
from prefixserving.router.policies.base import RoutingContext, RoutingPolicy, home, route
from prefixserving.router.policies.registry import make_policy
from prefixserving.router.prefix_hashing import KeyConfig, chat_key, completion_key

CONFIG = KeyConfig(block_chars=16, prefix_blocks=8)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def doc_request(doc: int, question: int) -> dict:
    return {
        "model": "m",
        "messages": [
            {"role": "system", "content": f"Document {doc:03d}: " + "lorem ipsum " * 6},
            {"role": "user", "content": f"q{question} " + "please explain it " * 3},
        ],
        "temperature": 0.5,
        "max_tokens": 7,
    }


def test_top_lists_the_deepest_shared_prefix_of_each_group_hottest_first() -> None:
    hot = HotPrefixes(CONFIG)
    for question in range(10):
        for doc, share in ((1, 5), (2, 2)):
            if question < share:
                body = doc_request(doc, question)
                hot.observe(chat_key(body, CONFIG), body)
    rows = hot.top(10)
    assert [r.hits for r in rows] == [5, 2]
    first = rows[0]
    assert first.kind == "chat"
    assert first.body["messages"][0]["content"].startswith("Document 001")
    assert "temperature" not in first.body and "max_tokens" not in first.body
    # The replay covers the shared blocks only: re-keying it gives the same leading blocks.
    full = chat_key(doc_request(1, 0), CONFIG)
    assert chat_key(first.body, CONFIG).blocks == full.blocks[: first.blocks]
    other = chat_key(doc_request(1, 1), CONFIG)
    shared = next(
        i for i, (a, b) in enumerate(zip(full.blocks, other.blocks, strict=True)) if a != b
    )
    assert first.blocks == shared


def test_a_hot_system_prompt_outranks_a_conversation_seen_twice_under_it() -> None:
    hot = HotPrefixes(CONFIG)
    for question in range(10):  # document 1 behind ten different questions
        body = doc_request(1, question)
        hot.observe(chat_key(body, CONFIG), body)
    for _ in range(2):  # one conversation under document 1 repeated once
        body = doc_request(1, 0)
        hot.observe(chat_key(body, CONFIG), body)
    for question in range(3):  # document 2 behind three questions
        body = doc_request(2, question)
        hot.observe(chat_key(body, CONFIG), body)
    # One slot: document 1 (12 requests) wins over document 2 (3), and is replayed through
    # the repeated conversation under it, which warms the document too.
    (row,) = hot.top(1)
    assert row.body["messages"][0]["content"].startswith("Document 001")
    assert row.body["messages"][-1]["content"].startswith("q0")
    # Two slots: document 2 as well; never an ancestor beside its descendant.
    rows = hot.top(2)
    assert [r.body["messages"][0]["content"][:12] for r in rows] == [
        "Document 002",
        "Document 001",
    ]


def test_memory_is_bounded_and_old_traffic_decays() -> None:
    clock = Clock()
    hot = HotPrefixes(CONFIG, capacity=64, half_life_s=10.0, clock=clock)
    for i in range(5):
        body = {"model": "m", "prompt": "old shared prefix!" * 4 + str(i)}
        hot.observe(completion_key(body, CONFIG), body)
    clock.now = 100.0  # ten half-lives later
    for i in range(1000):
        body = {"model": "m", "prompt": f"{i:06d}" + "x" * 60}
        hot.observe(completion_key(body, CONFIG), body)
        if i % 3 == 0:
            new = {"model": "m", "prompt": "new shared prefix!" * 4 + str(i)}
            hot.observe(completion_key(new, CONFIG), new)
    assert len(hot) <= 64
    rows = hot.top(5)
    assert rows and rows[0].body["prompt"].startswith("new shared prefix!")
    assert all(not r.body["prompt"].startswith("old") for r in rows)


def test_salted_requests_are_never_recorded() -> None:
    hot = HotPrefixes(CONFIG)
    for _ in range(5):
        body = {"model": "m", "prompt": "secret tenant prompt " * 4, "cache_salt": "t1"}
        hot.observe(completion_key(body, CONFIG), body)
    assert hot.top() == [] and len(hot) == 0


def test_owned_by_matches_the_policy_ranking_with_the_member_added() -> None:
    policy = make_policy("prefix-affinity")
    hot = HotPrefixes(CONFIG)
    backends = ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    for doc in range(40):
        for question in range(3):
            body = doc_request(doc, question)
            key = chat_key(body, CONFIG)
            hot.observe(key, body)
            route(policy, RoutingContext(key.blocks, tuple(backends)))
    member = "http://10.0.0.3:8000"
    owned = hot.owned_by(member, backends, policy, limit=1024)
    everything = hot.top(1024)
    assert len(everything) == 40
    # Rendezvous ranking: a new third member owns about a third of the prefixes.
    assert 5 <= len(owned) <= 25
    members = sorted([*backends, member])
    for row in everything:
        blocks = chat_key(row.body, CONFIG).blocks
        assert (row in owned) == (home(policy, blocks, members) == member)
    assert hot.owned_by(member, backends, make_policy("round-robin")) == []


def observed_docs(
    policy_name: str, backends: list[str], docs: int = 40
) -> tuple[HotPrefixes, RoutingPolicy]:
    """Three requests for each of ``docs`` documents, routed; engine keys ``(1000 + doc,)``."""
    policy = make_policy(policy_name)
    hot = HotPrefixes(CONFIG)
    for doc in range(docs):
        for question in range(3):
            body = doc_request(doc, question)
            key = chat_key(body, CONFIG)
            hot.observe(key, body, engine_keys=(1000 + doc,))
            route(policy, RoutingContext(key.blocks, tuple(backends)))
    return hot, policy


def test_replacing_a_backend_ranks_without_it() -> None:
    backends = ["http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.4:8000"]
    hot, policy = observed_docs("prefix-affinity", backends)
    member, replaced = "http://10.0.0.3:8000", backends[0]
    joined = hot.owned_by(member, backends, policy, limit=1024)
    handed = hot.owned_by(member, backends, policy, limit=1024, replaces=replaced)
    after = sorted([*backends[1:], member])
    for row in hot.top(1024):
        blocks = chat_key(row.body, CONFIG).blocks
        assert (row in handed) == (home(policy, blocks, after) == member)
    # The member keeps its share and takes part of the replaced backend's: its keys move to
    # their next choice, the member among them.
    assert all(row in handed for row in joined)
    assert len(handed) > len(joined)


def test_with_engine_events_the_replaced_backends_cache_is_handed_over() -> None:
    backends = ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    hot, policy = observed_docs("prefix-affinity", backends)
    member, replaced = "http://10.0.0.3:8000", backends[0]
    held = set(range(0, 40, 3))  # the documents whose requests the replaced engine holds

    def cached(keys: tuple[int, ...], among: Sequence[str]) -> dict[str, int]:
        return {b: 1 if b == replaced and keys[0] - 1000 in held else 0 for b in backends}

    handed = hot.owned_by(member, backends, policy, limit=1024, replaces=replaced, cached=cached)
    docs = {int(r.body["messages"][0]["content"][9:12]) for r in handed}
    assert held <= docs, "every prefix the replaced engine holds goes to its successor"
    # Without the handover the same cache state keeps them on the replaced engine.
    joined = hot.owned_by(member, backends, policy, limit=1024, cached=cached)
    assert not held & {int(r.body["messages"][0]["content"][9:12]) for r in joined}


def test_engine_keys_are_looked_up_once_per_source_request() -> None:
    backends = ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    hot, policy = HotPrefixes(CONFIG), make_policy("prefix-affinity")
    body = doc_request(1, 1)
    key = chat_key(body, CONFIG)
    assert len(key.blocks) > 1
    for _ in range(2):
        hot.observe(key, body, engine_keys=(1001,))
    lookups: list[tuple[int, ...]] = []

    def cached(keys: tuple[int, ...], among: Sequence[str]) -> dict[str, int]:
        lookups.append(keys)
        return dict.fromkeys(among, 0)

    hot.owned_by("http://10.0.0.3:8000", backends, policy, limit=1024, cached=cached)
    assert lookups == [(1001,)], "one lookup for the request, not one per stored prefix"
