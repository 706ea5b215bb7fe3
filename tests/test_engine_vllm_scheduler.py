"""PeekScheduler driven with no model: holding under chunked prefill, LoRA and cache_salt
isolation, FCFS order when nothing is shared, and vLLM's RequestQueue contract."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from vllm.config import SchedulerConfig
from vllm.lora.request import LoRARequest
from vllm.sampling_params import SamplingParams
from vllm.v1.core.kv_cache_utils import get_request_block_hasher
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request

from prefixserving import constants
from prefixserving.engine.vllm import PeekAsyncScheduler, PeekRequestQueue, PeekScheduler
from prefixserving.peek.settings import PeekSettings
from prefixserving_lab.models.replay_engine import EngineShape, build_scheduler, fast_block_hash

pytestmark = pytest.mark.slow  # imports vLLM

BLOCK = 128
SHARED_TOKENS = 3072


def make_request(
    rid: str,
    tokens: Sequence[int],
    *,
    arrival: float = 0.0,
    cache_salt: str | None = None,
    lora: LoRARequest | None = None,
    max_tokens: int = 4,
    block_size: int = BLOCK,
) -> Request:
    return Request(
        request_id=rid,
        prompt_token_ids=list(tokens),
        sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        pooling_params=None,
        arrival_time=arrival,
        cache_salt=cache_salt,
        lora_request=lora,
        block_hasher=get_request_block_hasher(block_size, fast_block_hash),
    )


def shared_prompt(i: int, shared: int = SHARED_TOKENS) -> list[int]:
    return list(range(1, shared + 1)) + [20000 + 100 * i + j for j in range(64)]


class Drive:
    """Runs a scheduler to completion with fabricated outputs; records what it computed."""

    def __init__(self, cls: type[Scheduler], threshold: int = 512, num_blocks: int = 400):
        shape = EngineShape(
            num_blocks=num_blocks,
            block_size=BLOCK,
            long_prefill_token_threshold=threshold,
            max_model_len=8192,
        )
        self.scheduler = build_scheduler(cls, shape)
        self.prefill_tokens = 0
        self.admitted: list[str] = []
        self.cached_at_admission: dict[str, int] = {}
        self.max_held = 0

    def run(self, max_steps: int = 1000) -> Drive:
        s = self.scheduler
        for _ in range(max_steps):
            if not s.has_unfinished_requests():
                return self
            out = s.schedule()
            if isinstance(s.waiting, PeekRequestQueue):
                self.max_held = max(self.max_held, s.waiting.num_held)
            for new in out.scheduled_new_reqs:
                self.admitted.append(new.req_id)
                self.cached_at_admission[new.req_id] = new.num_computed_tokens
            for rid, n in out.num_scheduled_tokens.items():
                request = s.requests[rid]
                if request.num_computed_tokens - n < request.num_prompt_tokens:
                    self.prefill_tokens += n
            ids = list(out.num_scheduled_tokens)
            sampled = [
                [7] if s.requests[r].num_computed_tokens >= s.requests[r].num_tokens else []
                for r in ids
            ]
            s.update_from_output(
                out,
                ModelRunnerOutput(
                    req_ids=ids,
                    req_id_to_index={r: i for i, r in enumerate(ids)},
                    sampled_token_ids=sampled,
                ),
            )
        raise AssertionError("requests did not finish")


@pytest.mark.parametrize(("async_scheduling", "base"), [(True, AsyncScheduler), (False, Scheduler)])
def test_the_rendered_scheduler_cls_runs_on_the_base_vllm_would_use(
    async_scheduling: bool, base: type[Scheduler]
) -> None:
    """The operator renders one --scheduler-cls; vLLM loads it by name and constructs it with
    the engine's resolved config. On a GPU (async scheduling on) it must be an AsyncScheduler,
    or vLLM loses async scheduling; on the CPU platform (off) a plain Scheduler."""
    cls = SchedulerConfig.default_factory(
        scheduler_cls=constants.PEEK_SCHEDULER_CLS
    ).get_scheduler_cls()
    assert cls is PeekScheduler
    shape = EngineShape(num_blocks=64, block_size=BLOCK, async_scheduling=async_scheduling)
    scheduler = build_scheduler(cls, shape)
    assert isinstance(scheduler, PeekScheduler) and isinstance(scheduler, base)
    assert isinstance(scheduler, AsyncScheduler) is async_scheduling
    assert scheduler.base == base.__name__
    # Forcing the async base by name keeps working.
    forced = build_scheduler(PeekAsyncScheduler, EngineShape(num_blocks=64, block_size=BLOCK))
    assert isinstance(forced, AsyncScheduler) and forced.base == "AsyncScheduler"


@pytest.mark.parametrize(
    ("stock_cls", "peek_cls"),
    [(Scheduler, PeekScheduler), (AsyncScheduler, PeekAsyncScheduler)],
    ids=["sync", "async"],
)
def test_chunked_prefill_siblings_wait_for_the_pioneer_then_hit(
    stock_cls: type[Scheduler], peek_cls: type[Scheduler]
) -> None:
    """platform-facts: 8 requests sharing 3072 tokens, prefill cut into 512-token chunks."""
    runs = {}
    for cls in (stock_cls, peek_cls):
        drive = Drive(cls)
        for i in range(8):
            drive.scheduler.add_request(make_request(f"r{i}", shared_prompt(i), arrival=i))
        runs[cls] = drive.run()
    stock, peek = runs[stock_cls], runs[peek_cls]
    ideal = SHARED_TOKENS + 8 * 64
    assert stock.prefill_tokens >= 6656
    assert peek.prefill_tokens == ideal
    assert peek.max_held >= 7
    assert peek.admitted[0] == "r0"  # the oldest is the pioneer
    for rid in peek.admitted[1:]:
        assert peek.cached_at_admission[rid] == SHARED_TOKENS, rid
    snapshot = peek.scheduler.replay_stats()
    assert snapshot["sibling_holds"] >= 7 and snapshot["held_siblings"] == 0


def test_unrelated_requests_are_not_held_behind_a_pioneer() -> None:
    drive = Drive(PeekScheduler)
    drive.scheduler.add_request(make_request("pioneer", shared_prompt(0), arrival=0))
    drive.scheduler.add_request(make_request("sibling", shared_prompt(1), arrival=1))
    unrelated = [50000 + j for j in range(SHARED_TOKENS)]
    drive.scheduler.add_request(make_request("unrelated", unrelated, arrival=2))
    out = drive.scheduler.schedule()  # the pioneer's first chunk
    # The sibling is held; the unrelated request behind it is admitted in the same step.
    assert [r.req_id for r in out.scheduled_new_reqs] == ["pioneer", "unrelated"]
    waiting = drive.scheduler.waiting
    assert waiting.num_held == 1 and len(waiting) == 1 and not waiting


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"cache_salt": "tenant-a"}, {"cache_salt": "tenant-b"}),
        ({"lora": LoRARequest("adapter-a", 1, "/a")}, {"lora": LoRARequest("adapter-b", 2, "/b")}),
        ({}, {"lora": LoRARequest("adapter-a", 1, "/a")}),
    ],
    ids=["cache_salt", "lora", "base-vs-lora"],
)
def test_different_adapter_or_salt_never_share(first: dict, second: dict) -> None:
    a = make_request("a", shared_prompt(0), arrival=0, **first)
    b = make_request("b", shared_prompt(0), arrival=1, **second)
    # vLLM puts the adapter and the salt into the block hashes: no block in common.
    assert not set(a.block_hashes) & set(b.block_hashes)
    drive = Drive(PeekScheduler)
    drive.scheduler.add_request(a)
    drive.scheduler.add_request(b)
    waiting = drive.scheduler.waiting
    # Neither shares a block with the other: neither has a cluster.
    assert waiting.index.shared_blocks("a") == waiting.index.shared_blocks("b") == 0
    drive.run()
    assert drive.max_held == 0
    assert drive.cached_at_admission["b"] == 0


def test_same_salt_is_shared() -> None:
    drive = Drive(PeekScheduler)
    drive.scheduler.add_request(make_request("a", shared_prompt(0), cache_salt="t"))
    drive.scheduler.add_request(make_request("b", shared_prompt(1), arrival=1, cache_salt="t"))
    drive.run()
    assert drive.max_held == 1
    assert drive.cached_at_admission["b"] == SHARED_TOKENS


def no_sharing_orders(num_blocks: int) -> dict[type[Scheduler], list[str]]:
    orders = {}
    for cls in (Scheduler, PeekScheduler):
        drive = Drive(cls, threshold=0, num_blocks=num_blocks)
        for i in range(24):
            tokens = [1000 * (i + 1) + j for j in range(300 + 37 * (i % 5))]
            drive.scheduler.add_request(make_request(f"r{i}", tokens, arrival=i, max_tokens=16))
        orders[cls] = drive.run().admitted
    return orders


def test_no_sharing_and_no_cache_pressure_admits_in_stock_order() -> None:
    """The cache holds everything: reordering buys no hits, so PEEK keeps vLLM's order."""
    orders = no_sharing_orders(num_blocks=400)
    assert orders[PeekScheduler] == orders[Scheduler]


def test_under_cache_pressure_cheaper_requests_go_first_within_the_overtake_budget() -> None:
    orders = no_sharing_orders(num_blocks=60)
    stock, peek = orders[Scheduler], orders[PeekScheduler]
    assert stock == sorted(stock, key=lambda rid: int(rid[1:]))
    assert peek != stock and sorted(peek) == sorted(stock)
    budget = PeekSettings().max_overtakes
    for position, rid in enumerate(peek):
        younger_ahead = [r for r in peek[:position] if int(r[1:]) > int(rid[1:])]
        assert len(younger_ahead) <= budget, rid


# -- vLLM's RequestQueue contract -------------------------------------------------------------
def queue_with(*rids: str) -> tuple[PeekRequestQueue, dict[str, Request]]:
    scheduler = build_scheduler(PeekScheduler, EngineShape(num_blocks=64, block_size=BLOCK))
    queue = scheduler.waiting
    requests = {
        rid: make_request(rid, [i * 1000 + j + 1 for j in range(200)]) for i, rid in enumerate(rids)
    }
    for request in requests.values():
        queue.add_request(request)
    return queue, requests


def ids(requests: object) -> list[str]:
    return [r.request_id for r in requests]  # type: ignore[attr-defined]


def test_queue_contract_add_peek_pop_len_bool_iter() -> None:
    queue, requests = queue_with("a", "b", "c")
    assert len(queue) == 3 and bool(queue)
    assert ids(queue) == ["a", "b", "c"]
    assert queue.peek_request() is requests["a"]
    assert queue.pop_request() is requests["a"]
    assert ids(queue) == ["b", "c"] and len(queue) == 2
    queue.pop_request()
    queue.pop_request()
    assert not queue and len(queue) == 0
    with pytest.raises(IndexError):
        queue.peek_request()
    with pytest.raises(IndexError):
        queue.pop_request()


def test_queue_contract_prepend_one_and_many_in_vllm_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With lanes off, prepend is vLLM's: to the front, the last of many first."""
    monkeypatch.setenv("PREFIXSERVING_LANES", "false")
    queue, _ = queue_with("a", "b")
    extra = {
        rid: make_request(rid, [9000 + ord(rid) * 300 + j for j in range(200)]) for rid in "xyz"
    }
    queue.prepend_request(extra["x"])
    assert ids(queue) == ["x", "a", "b"]
    # Like FCFSRequestQueue.extendleft: prepended in reverse order of appearance.
    queue.prepend_requests([extra["y"], extra["z"]])
    assert ids(queue) == ["z", "y", "x", "a", "b"]
    assert queue.peek_request() is extra["z"]


def test_prepend_under_peek_restores_a_skipped_request_and_resumes_a_preempted_one_first() -> None:
    queue, requests = queue_with("a", "b", "c")
    queue.begin_step(0.0)
    assert queue.pop_request() is requests["a"]
    # The engine skipped it in this step (grammar compiling, LoRA slots full): back in place.
    queue.prepend_request(requests["a"])
    assert ids(queue) == ["a", "b", "c"] and queue.peek_request() is requests["a"]
    assert queue.lanes.admitted_places == 0 and queue.lanes.work_tokens == 0  # refunded
    assert queue.pop_request() is requests["a"]
    queue.begin_step(1.0)
    # Preempted a step later: it resumes first, as vLLM resumes it, even while the lanes reorder.
    queue.prepend_request(requests["a"])
    queue.lanes.reorder = True
    assert ids(queue) == ["a", "b", "c"] and queue.peek_request() is requests["a"]
    assert queue.pop_request() is requests["a"]
    assert queue.stats.admitted["resume"] == 1
    # Skipped by the engine in the step that resumed it: it keeps its place in the resume lane.
    queue.prepend_request(requests["a"])
    assert queue.peek_request() is requests["a"] and queue.lanes.get("a").resume


def test_a_preempted_request_resumes_only_within_decode_headroom() -> None:
    """Resuming a request into blocks the running requests still need would only get it
    preempted again: headroom stops admissions at it as at any request."""
    queue, requests = queue_with("a", "b")
    queue.begin_step(0.0)
    queue.pop_request()
    queue.begin_step(1.0)
    queue.prepend_request(requests["a"])
    free = queue.view.free_blocks()
    queue.begin_step(2.0, reserve_blocks=free)
    assert not queue and queue.stats.headroom_stops == 1
    queue.begin_step(3.0, reserve_blocks=0)
    assert queue.peek_request() is requests["a"]


def test_queue_contract_remove_one_and_many() -> None:
    queue, requests = queue_with("a", "b", "c", "d")
    queue.remove_request(requests["b"])
    assert ids(queue) == ["a", "c", "d"]
    with pytest.raises(ValueError):
        queue.remove_request(requests["b"])
    outsider = make_request("outsider", [77] * 200)
    queue.remove_requests([requests["a"], requests["d"], outsider])
    assert ids(queue) == ["c"]
    assert queue.index.num_nodes == len(requests["c"].block_hashes)
