"""PeekQueue's prefix-cache probes and the guard's plan ranks, on a fake engine (no vLLM).

A presentation asks the engine about each block at most once (a cluster's members walk the
same blocks), and ``_plan``'s early stop on chained hashes gives the brute-force ranks.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixserving.peek.guard import Guard
from prefixserving.peek.queue import PLAN_REQUESTS, PeekQueue
from prefixserving.peek.settings import PeekSettings

BLOCK = 4


@dataclass
class FakeRequest:
    rid: str
    hashes: tuple[tuple[int, ...], ...]  # chained: each hash is the whole prefix it names
    running: bool = False


@dataclass
class FakeEngine:
    """The queue's EngineView and the guard's BlockPoolPort over a set of cached prefixes."""

    block_size: int = BLOCK
    cached: set[tuple[int, ...]] = field(default_factory=set)
    probes: Counter[tuple[int, ...]] = field(default_factory=Counter)

    def request_id(self, request: FakeRequest) -> str:
        return request.rid

    def block_hashes(self, request: FakeRequest) -> Sequence[tuple[int, ...]]:
        return request.hashes

    def num_tokens(self, request: FakeRequest) -> int:
        return len(request.hashes) * BLOCK + 1

    def priority_key(self, request: FakeRequest) -> None:
        return None

    def is_cached(self, block_hash: tuple[int, ...]) -> bool:
        self.probes[block_hash] += 1
        return block_hash in self.cached

    def allocated(self, request: FakeRequest) -> bool:
        return request.running

    def computed_tokens(self, request: FakeRequest) -> int:
        return 0

    def prefill_done(self, request: FakeRequest) -> bool:
        return not request.running

    def free_blocks(self) -> int:
        return 10_000

    # BlockPoolPort
    num_blocks = 10_000
    num_free = 10_000

    def free_lru(self) -> Iterator[tuple[Any, Any]]:
        return iter(())

    def cache_key(self, block_hash: tuple[int, ...]) -> tuple[int, ...]:
        return block_hash

    def cached_block(self, key: object) -> None:
        return None

    def is_free(self, block: object) -> bool:
        return True

    def move_to_mru(self, block: object) -> None: ...

    def pin(self, block: object) -> None: ...

    def unpin(self, block: object) -> None: ...


def chained(tokens: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(tokens[: end + BLOCK]) for end in range(0, len(tokens) - BLOCK + 1, BLOCK))


def make_queue(engine: FakeEngine, prompts: Sequence[Sequence[int]]) -> PeekQueue[Any, Any]:
    settings_ = PeekSettings(max_sibling_wait_ms=0)
    queue: PeekQueue[Any, Any] = PeekQueue(engine, settings_, Guard(engine, window_blocks=8))
    for i, tokens in enumerate(prompts):
        queue.add_request(FakeRequest(f"r{i}", chained(tokens)))
    return queue


def admit(engine: FakeEngine, queue: PeekQueue[Any, Any]) -> FakeRequest:
    """Pop the presented request and 'allocate' it: its blocks become cached."""
    request = queue.pop_request()
    request.running = True
    engine.cached.update(request.hashes)
    return request


def test_a_presentation_asks_the_engine_about_each_block_once() -> None:
    """Admitting a pioneer re-checks its whole cluster; 20 siblings sharing 8 blocks walk the
    same 8 hashes, and the engine is asked about each of them once."""
    shared = list(range(8 * BLOCK))
    prompts = [shared + [1000 + 10 * i + j for j in range(BLOCK)] for i in range(20)]
    engine = FakeEngine()
    queue = make_queue(engine, prompts)
    queue.begin_step(0.0)
    admit(engine, queue)
    engine.probes.clear()
    assert queue  # the next presentation confirms the admission and re-checks the cluster
    assert engine.probes, "the cluster was not re-checked"
    assert max(engine.probes.values()) == 1, engine.probes.most_common(3)
    # and the re-check took effect: the siblings now start at the cached prefix
    assert all(queue.index.frontier(f"r{i}") == 8 for i in range(1, 20))


prompt_sets = st.lists(
    st.lists(st.integers(0, 2), min_size=BLOCK, max_size=5 * BLOCK), min_size=1, max_size=40
)


@settings(max_examples=60, deadline=None)
@given(prompts=prompt_sets, cached_depth=st.integers(0, 5), admitted=st.integers(0, 5))
def test_plan_ranks_match_a_brute_force_recount(
    prompts: list[list[int]], cached_depth: int, admitted: int
) -> None:
    """Every cached block a planned request reads gets the position of the best planned request
    that reads it, and no other block gets a rank."""
    engine = FakeEngine()
    for tokens in prompts:  # cache some prefixes before the requests arrive
        engine.cached.update(chained(tokens)[: cached_depth % (len(tokens) // BLOCK + 1)])
    queue = make_queue(engine, prompts)
    queue.begin_step(0.0)
    for _ in range(min(admitted, len(prompts) - 1)):
        admit(engine, queue)
    assert queue or not queue.lanes  # presentation confirms the admissions
    expected: dict[tuple[int, ...], int] = {}
    for position, entry in enumerate(queue.lanes.plan(PLAN_REQUESTS)):
        for block_hash in queue.index.path(entry.rid)[: queue.index.frontier(entry.rid)]:
            expected.setdefault(block_hash, position)
    assert queue._plan()[0] == expected


@settings(max_examples=200, deadline=None)
@given(length=st.integers(0, 300), cached=st.integers(0, 300), start=st.integers(0, 300))
def test_the_frontier_probe_finds_the_cached_prefix_in_logarithmic_probes(
    length: int, cached: int, start: int
) -> None:
    """On a path whose first ``cached`` blocks are cached (what vLLM's cache keeps), galloping
    from ``start`` gives the walk's answer with at most 2 log2(k + 1) + 2 probes for k newly
    cached blocks."""
    hashes = list(range(length))
    cached, start = min(cached, length), min(start, length)
    probes: list[int] = []

    def is_cached(block: int) -> bool:
        probes.append(block)
        return block < cached

    frontier = PeekQueue._probe_frontier(hashes, is_cached, start)
    assert frontier == max(start, cached)
    newly = frontier - start
    assert len(probes) <= 2 * math.log2(newly + 1) + 2, (newly, probes)


def backlog_queue(reorder_on_backlog: bool) -> tuple[FakeEngine, PeekQueue[Any, Any]]:
    """A cold 8-block prompt, then a sibling whose 6-block prefix is cached (the cheaper one)."""
    shared = list(range(6 * BLOCK))
    engine = FakeEngine(cached=set(chained(shared)))
    settings_ = PeekSettings(max_sibling_wait_ms=0, reorder_on_backlog=reorder_on_backlog)
    queue: PeekQueue[Any, Any] = PeekQueue(engine, settings_, Guard(engine, window_blocks=8))
    queue.add_request(FakeRequest("cold", chained([5000 + t for t in range(8 * BLOCK)])))
    queue.add_request(FakeRequest("sibling", chained([*shared, *range(9000, 9000 + BLOCK)])))
    return engine, queue


def test_a_backlog_leaves_arrival_order_only_once_a_request_waited_a_whole_step() -> None:
    """``reorder_on_backlog``: requests that all joined since the last step are no backlog;
    once they wait through a step (the engine admitted nothing), the cheaper cached sibling
    goes first, with no cache pressure at all."""
    _, queue = backlog_queue(reorder_on_backlog=True)
    queue.begin_step(0.0)
    assert not queue.last_guard_report.pressure
    assert not queue.lanes.reorder and queue.peek_request().rid == "cold"
    queue.begin_step(1.0)
    assert not queue.last_guard_report.pressure
    assert queue.lanes.reorder and queue.peek_request().rid == "sibling"


def test_without_the_setting_a_backlog_keeps_arrival_order() -> None:
    _, queue = backlog_queue(reorder_on_backlog=False)
    for step in range(3):
        queue.begin_step(float(step))
        assert not queue.lanes.reorder and queue.peek_request().rid == "cold"


def test_requests_admitted_each_step_are_no_backlog() -> None:
    """Each step admits what waited and one request joins: nothing waits a whole step."""
    engine, queue = backlog_queue(reorder_on_backlog=True)
    queue.begin_step(0.0)
    admit(engine, queue)
    admit(engine, queue)
    shared = list(range(6 * BLOCK))
    for step in range(1, 4):
        queue.add_request(
            FakeRequest(f"n{step}", chained([*shared, *range(step * 100, step * 100 + BLOCK)]))
        )
        queue.begin_step(float(step))
        assert not queue.lanes.reorder
        admit(engine, queue)
