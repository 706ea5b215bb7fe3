"""Replay one workload through one scheduler class on a simulated clock.

Loop, until every request has arrived and finished:

1. add the requests whose arrival time has come (``Scheduler.add_request``); a closed-loop
   request (``ReplayRequest.after``) is due ``think_s`` after the request it follows
   finished, so its arrival is known only then;
2. ``schedule()`` (its CPU time is measured), then read the step's shape from the output:
   prefill tokens, decode sequences and context tokens
   (:class:`~prefixserving_lab.models.cost.StepShape`);
3. advance the clock by the cost model's ``step_s``; a step that schedules nothing advances
   it to the next arrival (or by ``base_s`` when requests are held and none is due);
4. fabricate the model output: one sampled token for each request whose scheduled tokens
   reach the end of its sequence, none for a prefill chunk that does not; then
   ``update_from_output()``, which appends the token and finishes the request once it has
   ``output_tokens`` (``max_tokens`` with ``ignore_eos``).

Per request it records the cached prompt tokens at first admission (what vLLM's prefix
cache stats count), the time of the first token and of the finish. vLLM's own prefix-cache
counters are accumulated from ``make_prefix_cache_stats()`` for the cross-check.

A scheduler that exposes ``use_clock(callable)`` gets the simulated clock, so time-based
rules (PEEK's sibling wait bound) run on simulated seconds; one that exposes
``replay_stats()`` has its result stored with the run.

Cost: the scheduler's own cost plus O(scheduled requests + log(due requests)) per step.
"""

from __future__ import annotations

import heapq
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vllm.sampling_params import SamplingParams
from vllm.v1.core.kv_cache_utils import get_request_block_hasher
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request

from prefixserving_lab.models.cost import CostModel, StepShape
from prefixserving_lab.models.replay_engine import EngineShape, build_scheduler, fast_block_hash
from prefixserving_lab.workloads.segments import SAMPLED_TOKEN, ReplayRequest, Workload

# Steps in a row that schedule nothing while nothing can arrive before the run is declared
# stuck (a policy that holds requests forever).
MAX_IDLE_STEPS = 100_000


class ReplayStuckError(RuntimeError):
    """The scheduler made no progress although requests were waiting."""


@dataclass(slots=True)
class RequestRecord:
    """What happened to one request during a replay (times in simulated seconds)."""

    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    shares_prefix: bool
    cached_tokens: int | None = None
    first_token_s: float | None = None
    finish_s: float | None = None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s


@dataclass(slots=True)
class ReplayRun:
    """The result of replaying one workload through one policy."""

    policy: str
    workload: str
    records: list[RequestRecord]
    steps: int = 0
    idle_steps: int = 0
    sim_s: float = 0.0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    preemptions: int = 0
    vllm_queries: int = 0
    vllm_hits: int = 0
    schedule_cpu_s: float = 0.0
    wall_s: float = 0.0
    policy_stats: dict[str, Any] = field(default_factory=dict)


class SimClock:
    """The simulated clock; calling it returns the current simulated time in seconds."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def replay(
    policy: str, scheduler_cls: type[Scheduler], workload: Workload, cost: CostModel
) -> ReplayRun:
    """Replay ``workload`` through ``scheduler_cls`` on its engine shape; see module doc."""
    wall_start = time.perf_counter()
    clock = SimClock()
    scheduler = build_scheduler(scheduler_cls, workload.engine)
    if hasattr(scheduler, "use_clock"):
        scheduler.use_clock(clock)
    make_request = request_factory(workload.engine)
    records = {
        r.request_id: RequestRecord(
            request_id=r.request_id,
            arrival_s=r.arrival_s,
            prompt_tokens=r.prompt_tokens,
            output_tokens=r.output_tokens,
            shares_prefix=r.shares_prefix,
        )
        for r in workload.requests
    }
    run = ReplayRun(policy=policy, workload=workload.name, records=list(records.values()))
    # Due requests as (arrival, sequence, request); closed-loop ones join when their
    # predecessor finishes.
    due = [(r.arrival_s, i, r) for i, r in enumerate(workload.requests) if r.after is None]
    heapq.heapify(due)
    followers: defaultdict[str, list[ReplayRequest]] = defaultdict(list)
    for r in workload.requests:
        if r.after is not None:
            followers[r.after].append(r)
    sequence = len(workload.requests)
    idle_in_a_row = 0
    while due or scheduler.has_unfinished_requests():
        while due and due[0][0] <= clock.now_s:
            arrival_s, _, spec = heapq.heappop(due)
            records[spec.request_id].arrival_s = arrival_s
            scheduler.add_request(make_request(spec, arrival_s))
        if not scheduler.has_unfinished_requests():
            clock.now_s = due[0][0]
            continue
        cpu_start = time.process_time()
        output = scheduler.schedule()
        run.schedule_cpu_s += time.process_time() - cpu_start
        _count_vllm_stats(scheduler, run)
        run.preemptions += len(output.preempted_req_ids)
        if output.total_num_scheduled_tokens == 0:
            scheduler.update_from_output(output, fabricate_output(output, scheduler))
            run.idle_steps += 1
            idle_in_a_row += 1
            if idle_in_a_row > MAX_IDLE_STEPS:
                raise ReplayStuckError(
                    f"{policy} on {workload.name}: {idle_in_a_row} steps scheduled nothing"
                )
            next_arrival = due[0][0] if due else float("inf")
            clock.now_s = min(next_arrival, clock.now_s + cost.base_s)
            continue
        idle_in_a_row = 0
        run.steps += 1
        shape = _step_shape(output, scheduler, records)
        run.prefill_tokens += shape.prefill_tokens
        run.decode_tokens += shape.decode_seqs
        clock.now_s += cost.step_s(shape)
        scheduled = [scheduler.requests[rid] for rid in output.num_scheduled_tokens]
        scheduler.update_from_output(output, fabricate_output(output, scheduler))
        for request in scheduled:
            record = records[request.request_id]
            if record.first_token_s is None and request.num_output_tokens > 0:
                record.first_token_s = clock.now_s
            if request.is_finished():
                record.finish_s = clock.now_s
                for follower in followers.pop(request.request_id, ()):
                    sequence += 1
                    heapq.heappush(due, (clock.now_s + follower.think_s, sequence, follower))
    run.sim_s = clock.now_s
    run.wall_s = time.perf_counter() - wall_start
    if hasattr(scheduler, "replay_stats"):
        run.policy_stats = dict(scheduler.replay_stats())
    return run


def _count_vllm_stats(scheduler: Scheduler, run: ReplayRun) -> None:
    """Take vLLM's prefix-cache counters for the step (recorded at admission, in tokens) before
    ``update_from_output`` folds them into its own stats and resets them."""
    stats = scheduler.kv_cache_manager.make_prefix_cache_stats()
    if stats is not None:
        run.vllm_queries += stats.queries
        run.vllm_hits += stats.hits


def request_factory(engine: EngineShape) -> Callable[[ReplayRequest, float], Request]:
    """Turn replay requests into vLLM ``Request``s hashed for ``engine``'s block size, with
    exactly ``output_tokens`` outputs (``ignore_eos``), arriving at the given time on the
    replay clock."""
    hasher = get_request_block_hasher(engine.block_size, fast_block_hash)

    def make(spec: ReplayRequest, arrival_s: float) -> Request:
        params = SamplingParams(max_tokens=spec.output_tokens, ignore_eos=True)
        return Request(
            request_id=spec.request_id,
            prompt_token_ids=spec.prompt_token_ids(),
            sampling_params=params,
            pooling_params=None,
            arrival_time=arrival_s,
            block_hasher=hasher,
        )

    return make


def _step_shape(
    output: SchedulerOutput, scheduler: Scheduler, records: dict[str, RequestRecord]
) -> StepShape:
    """Classify the step's work; also record first-admission cache hits."""
    for new in output.scheduled_new_reqs:
        record = records[new.req_id]
        if record.cached_tokens is None:
            record.cached_tokens = new.num_computed_tokens
    prefill = decode = context = 0
    for rid, n in output.num_scheduled_tokens.items():
        request = scheduler.requests[rid]
        before = request.num_computed_tokens - n
        context += before
        if n == 1 and before >= request.num_prompt_tokens:
            decode += 1
        else:
            prefill += n
    return StepShape(prefill_tokens=prefill, decode_seqs=decode, context_tokens=context)


def fabricate_output(output: SchedulerOutput, scheduler: Scheduler) -> ModelRunnerOutput:
    """The model runner's answer to ``output``: one sampled token for every request whose
    scheduled tokens reach the end of its sequence, none for an unfinished prefill chunk."""
    req_ids = list(output.num_scheduled_tokens)
    sampled: list[list[int]] = []
    for rid in req_ids:
        request = scheduler.requests[rid]
        done = request.num_computed_tokens >= request.num_tokens
        sampled.append([SAMPLED_TOKEN] if done else [])
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
        sampled_token_ids=sampled,
    )
