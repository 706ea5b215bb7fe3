"""The replay harness on vLLM's real scheduler: the clock follows the cost model, hit rates
match vLLM's own counters, and each baseline does what its source describes."""

from __future__ import annotations

import os

import pytest

from prefixserving_lab.models.cost import CostModel
from prefixserving_lab.models.replay_engine import EngineShape
from prefixserving_lab.models.schedulers.registry import POLICIES, scheduler_class
from prefixserving_lab.runners.replay import replay
from prefixserving_lab.runners.replay_metrics import summarize, ttft_slo_s
from prefixserving_lab.workloads.segments import (
    NS_ANSWER,
    NS_COLD,
    NS_QUESTION,
    NS_SYSTEM,
    ReplayRequest,
    Workload,
)

pytestmark = pytest.mark.slow  # imports vLLM

COST = CostModel(base_s=0.01, prefill_token_s=4e-5, decode_seq_s=5e-4, context_token_s=2e-8)
BLOCK = 16


def request(
    rid: str, arrival_s: float, segments: list[tuple[tuple[int, ...], int]], output: int
) -> ReplayRequest:
    return ReplayRequest(
        request_id=rid,
        arrival_s=arrival_s,
        segments=tuple(segments),
        output_tokens=output,
        shares_prefix=False,
    )


def workload(requests: list[ReplayRequest], **engine: int) -> Workload:
    shape = EngineShape(**{"num_blocks": 256, "block_size": BLOCK, "max_model_len": 8192, **engine})
    return Workload(
        name="w",
        description="",
        requests=tuple(requests),
        engine=shape,
        ideal_hit_rate=0.0,
        shared_blocks=0,
    )


def run(policy: str, w: Workload) -> dict:
    result = replay(policy, scheduler_class(policy), w, COST)
    metrics = summarize(result, ttft_slo_s(w, COST))
    return {"metrics": metrics, "records": {r.request_id: r for r in result.records}}


def first_token_order(out: dict) -> list[str]:
    return sorted(out["records"], key=lambda rid: out["records"][rid].first_token_s)


def test_the_clock_advances_exactly_by_the_cost_model() -> None:
    w = workload([request("a", 0.5, [((NS_COLD, 1), 256)], 4)])
    out = run("fcfs", w)
    record = out["records"]["a"]
    prefill_step = COST.base_s + 256 * COST.prefill_token_s
    decode_steps = sum(
        COST.base_s + COST.decode_seq_s + ctx * COST.context_token_s for ctx in (256, 257, 258)
    )
    assert record.ttft_s == pytest.approx(prefill_step)
    assert record.finish_s == pytest.approx(0.5 + prefill_step + decode_steps)
    assert out["metrics"]["steps"] == 4
    assert out["metrics"]["prefill_tokens"] == 256


def test_fcfs_on_requests_that_share_nothing_hits_nothing() -> None:
    w = workload([request(f"r{i}", 0.01 * i, [((NS_COLD, i), 300)], 3) for i in range(12)])
    m = run("fcfs", w)["metrics"]
    assert m["hit_rate"] == 0.0
    assert m["prefill_tokens"] == 12 * 300
    assert m["requests"] == 12 and m["hit_rate_matches_vllm"]


def siblings(n: int, prefix_tokens: int, arrival_s: float = 0.0) -> list[ReplayRequest]:
    return [
        request(
            f"s{i}",
            arrival_s,
            [((NS_SYSTEM, 5), prefix_tokens), ((NS_QUESTION, 5, i), 16)],
            2,
        )
        for i in range(n)
    ]


def test_hit_rate_agrees_with_vllm_counters_for_every_policy() -> None:
    w = workload([*siblings(6, 512), request("c", 0.0, [((NS_COLD, 7), 200)], 2)])
    for policy in POLICIES:
        m = run(policy, w)["metrics"]
        assert m["hit_rate_matches_vllm"], policy
        assert m["hit_rate"] > 0.5, policy
        assert m["requests"] == 7


def test_replays_are_deterministic() -> None:
    w = workload(siblings(5, 256) + siblings(3, 128, arrival_s=0.05))
    assert run("fcfs", w)["metrics"]["ttft_s"] == run("fcfs", w)["metrics"]["ttft_s"]


CHUNKED = {"long_prefill_token_threshold": 256, "max_num_batched_tokens": 2048}


def test_chunked_siblings_recompute_under_fcfs_and_the_deferral_saves_some() -> None:
    w = workload(siblings(8, 1024), **CHUNKED)
    ideal = 1024 + 8 * 16
    fcfs = run("fcfs", w)["metrics"]["prefill_tokens"]
    defer = run("trtllm_defer", w)["metrics"]["prefill_tokens"]
    assert fcfs > ideal * 1.5
    assert defer < fcfs


def test_peek_computes_a_chunked_shared_prefix_about_once() -> None:
    w = workload(siblings(8, 1024), **CHUNKED)
    peek = run("peek", w)["metrics"]["prefill_tokens"]
    assert peek < run("fcfs", w)["metrics"]["prefill_tokens"]
    assert peek <= (1024 + 8 * 16) * 1.25


def test_sglang_lpm_admits_the_cached_request_first() -> None:
    prefix = [((NS_SYSTEM, 9), 128)]
    w = workload(
        [
            request("warm", 0.0, [*prefix, ((NS_QUESTION, 9, 0), 16)], 1),
            request("cold", 1.0, [((NS_COLD, 9), 160)], 1),
            request("hit", 1.0, [*prefix, ((NS_QUESTION, 9, 1), 16)], 1),
        ],
        max_num_batched_tokens=160,
        max_num_seqs=8,
    )
    fcfs, lpm = run("fcfs", w)["records"], run("sglang_lpm", w)["records"]
    assert lpm["hit"].cached_tokens == 128
    assert lpm["hit"].first_token_s < fcfs["hit"].first_token_s


def test_queue_informed_lru_keeps_the_prefix_a_queued_request_needs() -> None:
    prefix = [((NS_SYSTEM, 11), 128)]
    w = workload(
        [
            request("a", 0.0, [*prefix, ((NS_QUESTION, 11, 0), 16)], 1),
            request("d", 1.0, [((NS_COLD, 11, 1), 96)], 1),
            request("b", 2.0, [((NS_COLD, 11, 2), 192)], 1),
            request("c", 2.0, [*prefix, ((NS_QUESTION, 11, 1), 16)], 1),
        ],
        num_blocks=21,
    )
    fcfs, lru = run("fcfs", w)["records"], run("queue_lru", w)["records"]
    # Stock LRU: b's allocation evicts most of the prefix (freed before d's blocks).
    assert fcfs["c"].cached_tokens <= 32
    # Queue-informed: the prefix c needs was moved behind d's blocks and survives whole.
    assert lru["c"].cached_tokens == 128


def test_a_closed_loop_turn_arrives_think_time_after_its_predecessor_and_hits_its_blocks() -> None:
    first = request("t0", 0.0, [((NS_SYSTEM, 7), 64)], 9)
    answer = ((NS_ANSWER, 7, 0), 9)
    second = ReplayRequest(
        request_id="t1",
        arrival_s=0.0,
        segments=(((NS_SYSTEM, 7), 64), answer, ((NS_QUESTION, 7, 1), 16)),
        output_tokens=4,
        shares_prefix=False,
        after="t0",
        think_s=1.5,
    )
    out = run("fcfs", workload([first, second]))
    one, two = out["records"]["t0"], out["records"]["t1"]
    assert two.arrival_s == pytest.approx(one.finish_s + 1.5)
    # The prompt and all but the last output token were computed: 64 + 8 = 72 tokens, four
    # full 16-token blocks of which vLLM keeps the cached ones.
    assert two.cached_tokens == 64


def test_tpot_and_goodput_follow_the_records() -> None:
    requests = [request(f"r{i}", 0.0, [((NS_COLD, i), 256)], 11) for i in range(4)]
    w = workload(requests, max_num_batched_tokens=256)  # one prompt per step: they queue
    out = run("fcfs", w)
    m, records = out["metrics"], out["records"].values()
    tpots = sorted((r.finish_s - r.first_token_s) / 10 for r in records)
    assert m["tpot_s"]["p50"] == pytest.approx(tpots[1] + (tpots[2] - tpots[1]) / 2, abs=1e-4)
    slo = ttft_slo_s(w, COST)
    assert slo == pytest.approx(3 * (COST.base_s + 256 * COST.prefill_token_s), rel=1e-3)
    good = sum(1 for r in records if r.ttft_s <= slo)
    assert 0 < good < 4  # the first prompts meet 3 x one idle prefill, the last do not
    assert m["slo_attainment"] == good / 4


def test_peek_keeps_arrival_order_when_no_request_can_reuse_anything() -> None:
    # Unique prompts of different lengths on a cache that holds a few of them: the free
    # queue is short every step (the guard's pressure) and a least-work-first order would
    # differ from arrival order, but reordering could save no prefill.
    requests = [
        request(f"u{i}", 0.01 * i, [((NS_COLD, 100 + i), 96 + 48 * (i * 7 % 5))], 8)
        for i in range(24)
    ]
    w = workload(requests, num_blocks=48)
    fcfs, peek = run("fcfs", w), run("peek", w)
    # (Timing may still differ: PEEK's decode headroom admits later than vLLM, which admits
    # and then preempts.)
    assert first_token_order(peek) == first_token_order(fcfs)


def backlog_without_pressure(shared: bool) -> Workload:
    """Cold 480-token prompts and cheap siblings of one cached 256-token prefix (or, with
    ``shared`` False, unique prompts of the siblings' length) arriving together, on a cache that
    holds them all and a 512-token step budget: a queue that outlasts steps, never pressure."""
    first = request("g0", 0.0, [((NS_SYSTEM, 9), 256), ((NS_QUESTION, 9, 0), 16)], 2)
    rest = []
    for i in range(1, 13):
        arrival = 0.001 * i
        rest.append(request(f"c{i}", arrival, [((NS_COLD, 90 + i), 480)], 2))
        prompt = [((NS_SYSTEM, 9), 256), ((NS_QUESTION, 9, i), 16)]
        rest.append(request(f"s{i}", arrival, prompt if shared else [((NS_COLD, i), 272)], 2))
    return workload([first, *rest], num_blocks=1024, max_num_batched_tokens=512)


def test_reordering_on_a_backlog_lets_cached_siblings_pass_cold_prompts_without_pressure() -> None:
    """``PREFIXSERVING_REORDER_ON_BACKLOG`` (``peek_backlog``): with no cache pressure, PEEK keeps
    arrival order; the variant leaves it once a request waits through a step, so siblings whose
    prefix is cached start before older cold prompts, and their median TTFT falls."""
    w = backlog_without_pressure(shared=True)
    fcfs, peek, backlog = run("fcfs", w), run("peek", w), run("peek_backlog", w)
    assert peek["metrics"]["policy_stats"]["pressure_steps"] == 0
    assert backlog["metrics"]["policy_stats"]["pressure_steps"] == 0
    assert first_token_order(peek) == first_token_order(fcfs)
    order = first_token_order(backlog)
    assert order != first_token_order(fcfs)
    assert order.index("s12") < order.index("c6")

    def sibling_p50(out: dict) -> float:
        ttfts = sorted(out["records"][f"s{i}"].ttft_s for i in range(1, 13))
        return (ttfts[5] + ttfts[6]) / 2

    assert sibling_p50(backlog) < sibling_p50(fcfs) / 2


def test_reordering_on_a_backlog_keeps_arrival_order_when_nothing_is_reused() -> None:
    w = backlog_without_pressure(shared=False)
    assert first_token_order(run("peek_backlog", w)) == first_token_order(run("fcfs", w))


def test_the_backlog_variant_runs_peek_with_its_flag_only() -> None:
    """``peek_backlog`` is the shipped PeekScheduler with ``PREFIXSERVING_REORDER_ON_BACKLOG`` on
    for its construction only; PEEK's default leaves it off."""
    from prefixserving import constants
    from prefixserving_lab.models.replay_engine import build_scheduler

    shape = EngineShape(num_blocks=256)
    peek = build_scheduler(scheduler_class("peek"), shape)
    variant = build_scheduler(scheduler_class("peek_backlog"), shape)
    assert constants.ENV_REORDER_ON_BACKLOG not in os.environ
    assert isinstance(variant, type(peek))
    assert not peek.waiting.settings.reorder_on_backlog
    assert variant.waiting.settings.reorder_on_backlog


def test_the_fcfs_bound_variants_run_peek_with_their_settings_only() -> None:
    """``peek_fcfs_bound`` is the shipped PeekScheduler with the FCFS bound on and the overtake
    budget at the largest value ``spec.scheduler.maxOvertakes`` admits (so users can set what
    it measures); ``peek_fcfs_bound_backlog`` adds reordering on a backlog. PEEK's default
    leaves the bound off, and the process environment is left as it was."""
    from prefixserving import constants
    from prefixserving.api.types import SchedulerSpec
    from prefixserving_lab.models.replay_engine import build_scheduler

    shape = EngineShape(num_blocks=256)
    peek = build_scheduler(scheduler_class("peek"), shape)
    bound = build_scheduler(scheduler_class("peek_fcfs_bound"), shape)
    backlog = build_scheduler(scheduler_class("peek_fcfs_bound_backlog"), shape)
    assert constants.ENV_FCFS_BOUND not in os.environ
    largest = SchedulerSpec.model_json_schema()["properties"]["maxOvertakes"]["maximum"]
    assert not peek.waiting.lanes.fcfs_bound
    for variant in (bound, backlog):
        assert isinstance(variant, type(peek))
        assert variant.waiting.lanes.fcfs_bound
        assert variant.waiting.lanes.max_overtakes == largest
    assert not bound.waiting.settings.reorder_on_backlog
    assert backlog.waiting.settings.reorder_on_backlog


def test_the_response_ratio_variant_runs_peek_with_its_bound_only() -> None:
    """``peek_rr16`` is the shipped PeekScheduler with the lanes' bound at 16, and reading
    its setting leaves the process environment as it was."""
    from prefixserving import constants
    from prefixserving.peek.lanes import MAX_RESPONSE_RATIO
    from prefixserving_lab.models.replay_engine import build_scheduler

    shape = EngineShape(num_blocks=256)
    peek = build_scheduler(scheduler_class("peek"), shape)
    variant = build_scheduler(scheduler_class("peek_rr16"), shape)
    assert constants.ENV_MAX_RESPONSE_RATIO not in os.environ
    assert peek.waiting.lanes.max_response_ratio == MAX_RESPONSE_RATIO == 8.0
    assert variant.waiting.lanes.max_response_ratio == 16.0
    assert isinstance(variant, type(peek))


def test_the_overtakes_variant_runs_peek_with_the_specs_largest_budget() -> None:
    """``peek_ovt100k`` is the shipped PeekScheduler with the overtake budget at the largest
    value ``spec.scheduler.maxOvertakes`` admits, so users can set what it measures."""
    from prefixserving import constants
    from prefixserving.api.types import SchedulerSpec
    from prefixserving.peek.lanes import DEFAULT_MAX_OVERTAKES
    from prefixserving_lab.models.replay_engine import build_scheduler

    shape = EngineShape(num_blocks=256)
    peek = build_scheduler(scheduler_class("peek"), shape)
    variant = build_scheduler(scheduler_class("peek_ovt100k"), shape)
    assert constants.ENV_MAX_OVERTAKES not in os.environ
    assert isinstance(variant, type(peek))
    assert peek.waiting.lanes.max_overtakes == DEFAULT_MAX_OVERTAKES == 128
    largest = SchedulerSpec.model_json_schema()["properties"]["maxOvertakes"]["maximum"]
    assert variant.waiting.lanes.max_overtakes == largest == 100_000


def test_peek_reserves_one_block_per_running_request_more_than_the_no_reserve_variant() -> None:
    """``peek_no_reserve`` is the shipped PeekScheduler with decode headroom keeping only the
    running requests' next-step blocks; PEEK's default keeps one block more for each of them.
    Neither computes a reserve for a step that starts with nothing waiting (nothing is
    presented then)."""
    from prefixserving import constants
    from prefixserving.engine.vllm import PeekScheduler
    from prefixserving_lab.models.replay_engine import build_scheduler
    from prefixserving_lab.runners.replay import request_factory

    shape = EngineShape(num_blocks=256, block_size=BLOCK, max_model_len=8192)
    peek = build_scheduler(scheduler_class("peek"), shape)
    variant = build_scheduler(scheduler_class("peek_no_reserve"), shape)
    assert isinstance(variant, PeekScheduler)
    assert constants.ENV_DECODE_RESERVE_BLOCKS not in os.environ
    assert peek.peek_settings.decode_reserve_blocks == 1
    assert variant.peek_settings.decode_reserve_blocks == 0
    assert peek._decode_reserve_blocks() is None  # nothing runs: no reserve
    make = request_factory(shape)
    for scheduler in (peek, variant):
        for r in siblings(3, 64):
            scheduler.add_request(make(r, r.arrival_s))
        scheduler.schedule()
        assert len(scheduler.running) == 3
        assert scheduler._decode_reserve_blocks() is None  # nothing waits: nothing to check
        late = request("late", 0.0, [((NS_COLD, 0), 80)], 4)
        scheduler.add_request(make(late, late.arrival_s))
    next_step = variant._decode_reserve_blocks()
    assert next_step is not None
    assert peek._decode_reserve_blocks() == next_step + 3


def test_a_step_with_every_request_slot_taken_checks_nothing_against_the_decode_reserve() -> None:
    """With every request slot taken vLLM admits nothing (its waiting loop stops at the slot
    check), so PEEK computes no reserve for the step and counts no headroom stop, though the
    waiting request would not fit beside the reserve (it does count one with a slot free)."""
    from prefixserving_lab.models.replay_engine import build_scheduler
    from prefixserving_lab.runners.replay import request_factory

    cold = [request(f"c{i}", 0.0, [((NS_COLD, i), 80)], 4) for i in range(4)]
    make = request_factory(EngineShape(num_blocks=22, block_size=BLOCK, max_model_len=8192))
    schedulers = {}
    for slots in (3, 4):
        shape = EngineShape(num_blocks=22, block_size=BLOCK, max_model_len=8192, max_num_seqs=slots)
        scheduler = build_scheduler(scheduler_class("peek"), shape)
        for r in cold[:3]:
            scheduler.add_request(make(r, r.arrival_s))
        scheduler.schedule()
        assert len(scheduler.running) == 3
        scheduler.add_request(make(cold[3], 0.0))
        schedulers[slots] = scheduler
    full, free = schedulers[3], schedulers[4]
    assert full._decode_reserve_blocks() is None
    reserve = free._decode_reserve_blocks()
    assert reserve is not None and reserve >= 3
    # The fourth request needs 6 new blocks; the pool keeps fewer than that beyond the reserve.
    assert free.kv_cache_manager.block_pool.get_num_free_blocks() - 6 < reserve
    for scheduler, stops in ((free, 1), (full, 0)):
        scheduler.schedule()
        assert len(scheduler.running) == 3 and len(scheduler.waiting) == 1
        assert scheduler.peek_snapshot().headroom_stops == stops
