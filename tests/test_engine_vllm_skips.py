"""PEEK on vLLM's paths that pop a request without allocating it, and on the cases that end a
hold early: a skipped request never becomes a pioneer that holds its siblings; an aborted
sibling leaves no hold behind; a preempted pioneer hands its siblings back; a hybrid KV layout
keeps vLLM's order; the priority policy is honoured.

Each test drives vLLM's real ``Scheduler`` with no model (the replay engine builder) and puts the
engine in the state the path needs the way vLLM itself does (a request status vLLM's own
``_handle_blocked_waiting_request`` skips, a LoRA adapter beyond ``max_loras``, an abort through
``finish_requests``, a KV cache too small to keep a prefill running)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tests.test_engine_vllm_scheduler import BLOCK, Drive, make_request, shared_prompt
from vllm.lora.request import LoRARequest
from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

from prefixserving.engine.vllm import PeekScheduler
from prefixserving_lab.models.replay_engine import EngineShape, build_scheduler, vllm_config_for
from prefixserving_lab.runners.replay import fabricate_output

pytestmark = pytest.mark.slow  # imports vLLM

CHUNKED = EngineShape(
    num_blocks=400, block_size=BLOCK, long_prefill_token_threshold=512, max_model_len=8192
)


@pytest.mark.parametrize(
    "blocked_status",
    [RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR, RequestStatus.WAITING_FOR_REMOTE_KVS],
    ids=["grammar-compiling", "kv-connector-load-pending"],
)
def test_a_request_vllm_skips_never_holds_its_siblings(blocked_status: RequestStatus) -> None:
    """vLLM pops a blocked request and puts it back in the same step without allocating it
    (grammar still compiling: no grammar yet; KV transfer pending: not in
    finished_recving_kv_req_ids). It must not become the pioneer its siblings wait for."""
    drive = Drive(PeekScheduler)
    blocked = make_request("blocked", shared_prompt(0), arrival=0)
    blocked.status = blocked_status
    drive.scheduler.add_request(blocked)
    drive.scheduler.add_request(make_request("sibling", shared_prompt(1), arrival=1))
    for step in range(3):
        out = drive.scheduler.schedule()
        waiting = drive.scheduler.waiting
        assert not waiting.holding.is_pioneer("blocked")
        assert not waiting.holding.is_held("sibling"), f"sibling held at step {step}"
        scheduled = [r.req_id for r in out.scheduled_new_reqs]
        assert "blocked" not in scheduled
        if step == 0:
            assert scheduled == ["sibling"]  # the sibling is the real pioneer
    assert drive.scheduler.waiting.holding.pioneers == ["sibling"]


def test_a_request_skipped_for_lora_slots_never_holds_its_siblings() -> None:
    """max_loras=1: a waiting request for a second adapter is skipped while the first runs."""
    scheduler = build_scheduler(PeekScheduler, dataclasses.replace(CHUNKED, max_loras=1))
    assert isinstance(scheduler, PeekScheduler)
    running = make_request(
        "running", [50000 + j for j in range(200)], lora=LoRARequest("a", 1, "/a")
    )
    scheduler.add_request(running)
    first = scheduler.schedule()
    scheduler.update_from_output(first, fabricate_output(first, scheduler))  # it decodes next
    other = LoRARequest("b", 2, "/b")
    scheduler.add_request(make_request("skipped", shared_prompt(0), arrival=1, lora=other))
    scheduler.add_request(make_request("sibling", shared_prompt(1), arrival=2, lora=other))
    out = scheduler.schedule()
    assert [r.req_id for r in out.scheduled_new_reqs] == []
    waiting = scheduler.waiting
    assert not waiting.holding.is_pioneer("skipped") and waiting.num_held == 0
    assert [r.request_id for r in waiting] == ["skipped", "sibling"]


def test_aborting_a_held_sibling_leaves_no_hold_behind() -> None:
    drive = Drive(PeekScheduler)
    scheduler = drive.scheduler
    for i in range(3):
        scheduler.add_request(make_request(f"r{i}", shared_prompt(i), arrival=i))
    scheduler.schedule()  # r0's first chunk; r1 and r2 wait for it
    waiting = scheduler.waiting
    assert waiting.num_held == 2
    scheduler.finish_requests("r1", RequestStatus.FINISHED_ABORTED)
    assert waiting.num_held == 1 and not waiting.holding.is_held("r1")
    assert [r.request_id for r in waiting] == ["r2"]
    waiting.index.check_invariants()
    drive.run()
    assert drive.cached_at_admission["r2"] > 0


def test_a_preempted_pioneer_hands_its_siblings_back() -> None:
    """Two clusters whose prefixes (25 blocks each) do not fit the cache (40 blocks) together:
    the second pioneer's next chunk cannot be allocated and vLLM preempts it; its sibling is
    released at once and the run completes."""
    drive = Drive(PeekScheduler, num_blocks=40)
    scheduler = drive.scheduler
    for cluster, base in (("a", 0), ("b", 100000)):
        for i in range(2):
            tokens = [base + 1 + t for t in range(3072)] + [
                base + 50000 + 100 * i + j for j in range(64)
            ]
            scheduler.add_request(
                make_request(f"{cluster}{i}", tokens, arrival=len(scheduler.requests))
            )
    preempted_pioneers: set[str] = set()
    for _ in range(400):
        if not scheduler.has_unfinished_requests():
            break
        waiting = scheduler.waiting
        pioneers = set(waiting.holding.pioneers)
        out = scheduler.schedule()
        for rid in pioneers & set(out.preempted_req_ids):
            preempted_pioneers.add(rid)
            assert not waiting.holding.is_pioneer(rid)
            assert all(info.pioneer != rid for info in waiting.holding.held().values())
        scheduler.update_from_output(out, fabricate_output(out, scheduler))
    assert preempted_pioneers, "the scenario must preempt a pioneer"
    assert not scheduler.has_unfinished_requests()


def test_a_hybrid_kv_layout_keeps_vllms_order() -> None:
    vllm_config = vllm_config_for(CHUNKED)
    vllm_config.cache_config.num_gpu_blocks = CHUNKED.num_blocks
    full = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32)
    window = SlidingWindowSpec(
        block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32, sliding_window=256
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=CHUNKED.num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["full"], full), KVCacheGroupSpec(["window"], window)],
    )
    scheduler = PeekScheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=BLOCK,
        log_stats=True,
    )
    assert "hybrid KV cache layout" in scheduler.fallback
    assert not scheduler.peek_settings.lanes and scheduler.peek_settings.max_sibling_wait_ms == 0
    assert scheduler.waiting.guard is None
    assert scheduler.peek_snapshot().fallback == scheduler.fallback


def test_the_priority_policy_is_honoured() -> None:
    scheduler = build_scheduler(PeekScheduler, CHUNKED, "priority")
    assert scheduler.policy == SchedulingPolicy.PRIORITY
    for i, priority in enumerate([2, 0, 1]):
        request = make_request(f"r{i}", [40000 + 1000 * i + j for j in range(100)], arrival=i)
        request.priority = priority
        scheduler.add_request(request)
    out = scheduler.schedule()
    assert [r.req_id for r in out.scheduled_new_reqs] == ["r1", "r2", "r0"]
    assert build_scheduler(PeekScheduler, CHUNKED).policy == SchedulingPolicy.FCFS
