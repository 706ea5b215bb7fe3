"""Scheduler CPU time per step with many waiting requests, against stock vLLM.

For each queue depth N (default 100, 1,000 and 10,000) and each policy:

1. build the scheduler with a cache that holds the running set, fill the waiting queue with
   N requests of shared-prefix groups (``GROUP_SIZE`` prompts per group, ``PREFIX_TOKENS``
   shared + ``QUESTION_TOKENS`` own tokens, ``OUTPUT_TOKENS`` outputs);
2. run ``WARMUP_STEPS`` steps, then ``steps`` measured steps (``TIMED_STEPS`` for CPU time,
   ``MEASURED_STEPS`` counted: see their comments); after every step, top the queue back up to
   N (so every measured step sees N waiting);
3. measure CPU time (``time.process_time``) of everything the engine calls on the scheduler
   per step: ``add_request`` for the top-up, ``schedule`` and ``update_from_output``, plus the
   garbage collections that run between those calls (``gc_ms``). Building the top-up's vLLM
   requests and the model runner's output is left out: it is the same work under every policy
   (about 0.5 ms a step at 1,000 waiting on the project's VM, which diluted every ratio when it
   was counted), but a collection it sets off walks the scheduler's young objects too.

Each pass starts as vLLM's engine core does after start-up: the heap is collected and frozen
(``freeze_gc_heap``), so an earlier pass's garbage is not collected on this pass's time.
The reported figures are the mean CPU milliseconds per step (best of ``repeats`` rounds, to damp
noise from other processes) and the ratio to stock FCFS at the same N: the median over the
rounds of the two policies' totals in the same round (the rounds interleave the policies, so a
load change on the machine reaches both sides of each ratio). :func:`profile` runs
one pass (set-up included) under ``cProfile`` and returns the own time of the policy's code
and its costliest functions, for the report when a policy misses its overhead goal.

:func:`measure_instructions` is the deterministic twin of :func:`measure`: each policy runs one
pass in a child process under callgrind (:mod:`.callgrind`), which counts the instructions and
simulated cache misses of exactly the work that step 3 times, with a simulated clock
(``SIM_STEP_S`` per step, so sibling holds do not depend on how slowly the pass runs) and a
fixed hash seed.
The same code gives counts within 0.2% of each other, busy machine or not; the CPU-time ratios
above moved by tens of percent from round to round on this project's machines. The counts leave
out branch prediction and the TLB, so they complement the CPU times rather than replace them.
"""

from __future__ import annotations

import cProfile
import gc
import os
import pstats
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from vllm.utils.gc_utils import freeze_gc_heap
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

from prefixserving_lab.models.replay_engine import EngineShape, build_scheduler
from prefixserving_lab.models.schedulers.registry import BASELINE, scheduler_class
from prefixserving_lab.runners import callgrind
from prefixserving_lab.runners.replay import SimClock, fabricate_output, request_factory
from prefixserving_lab.workloads.segments import NS_QUESTION, NS_SYSTEM, ReplayRequest

GROUP_SIZE = 16
PREFIX_TOKENS = 1024
QUESTION_TOKENS = 64
OUTPUT_TOKENS = 16
WARMUP_STEPS = 5
ENGINE = EngineShape(num_blocks=8192, block_size=64, max_num_seqs=256)
# Simulated seconds per step of the counted pass (about a decode step on one accelerator).
SIM_STEP_S = 0.010
# Measured steps of a counted pass. With the default engine a pass cycles every 16 steps:
# about 4 steps admit (8,192 prefill tokens each) until 256 requests run, then about 11
# decode-only steps until they finish (OUTPUT_TOKENS). A window must cover whole cycles: 10
# steps from WARMUP_STEPS hold no admission at all, where a policy's ordering code barely runs
# (the counted ratio of PEEK was x1.04 over them and x1.09 over these 30).
MEASURED_STEPS = 30
# Measured steps of a timed pass: whole cycles of Python's full collections too. One runs when
# the objects that survived since the last one reach a quarter of those it kept: about every
# N / 64 steps here (16 arrivals a step), 0.1-0.3 s each at 10,000 waiting. A 30-step window
# caught one or none by chance (PEEK x3.2 or x1.13 at 10,000 from one run to the next).
TIMED_STEPS = 320

T = TypeVar("T")


def measure(
    classes: dict[str, type[Scheduler]],
    waiting: int,
    *,
    steps: int = TIMED_STEPS,
    repeats: int = 7,
) -> dict[str, dict[str, Any]]:
    """CPU ms per step of each policy in ``classes`` with ``waiting`` requests queued (module
    docstring). ``classes`` must hold the baseline (FCFS). The repeats are interleaved (every
    policy once per round); each policy keeps its best round's times, and ``x_fcfs`` is the
    median over the rounds of its total over the baseline's in the same round, so a load change
    on the machine between rounds cancels out of the ratio."""
    if BASELINE not in classes:
        raise ValueError(f"the overhead table needs the {BASELINE} baseline among the policies")
    best: dict[str, dict[str, float]] = {}
    ratios: dict[str, list[float]] = {policy: [] for policy in classes}
    for _ in range(repeats):
        rounds = {policy: _one_pass(cls, waiting, steps) for policy, cls in classes.items()}
        for policy, result in rounds.items():
            ratios[policy].append(result["total_ms"] / rounds[BASELINE]["total_ms"])
            if policy not in best or result["total_ms"] < best[policy]["total_ms"]:
                best[policy] = result
    return {
        policy: {
            "waiting": waiting,
            "steps": steps,
            "repeats": repeats,
            **{k: round(v, 4) for k, v in row.items()},
            "x_fcfs": round(statistics.median(ratios[policy]), 4),
        }
        for policy, row in best.items()
    }


def profile(
    scheduler_cls: type[Scheduler],
    waiting: int,
    *,
    steps: int = MEASURED_STEPS,
    top: int = 15,
    focus: tuple[str, ...] = ("prefixserving/peek/", "prefixserving/engine/vllm.py"),
) -> dict[str, Any]:
    """Profile one measured pass (module docstring): the pass's total profiled time, the own
    time spent in the ``focus`` files (the policy's code) and its ``top`` functions by own
    time."""
    profiler = cProfile.Profile()
    profiler.enable()
    _one_pass(scheduler_cls, waiting, steps)
    profiler.disable()
    stats = pstats.Stats(profiler)
    raw = stats.stats  # type: ignore[attr-defined]
    total_s = sum(own_s for (_, _, own_s, _, _) in raw.values())
    rows = [
        {
            "function": f"{_short(filename)}:{line}({name})",
            "calls": calls,
            "own_ms": round(1000 * own_s, 3),
            "cumulative_ms": round(1000 * cumulative_s, 3),
        }
        for (filename, line, name), (_, calls, own_s, cumulative_s, _) in raw.items()
        if any(f in filename for f in focus)
    ]
    rows.sort(key=lambda r: r["own_ms"], reverse=True)
    return {
        "total_ms": round(1000 * total_s, 3),
        "focus_own_ms": round(sum(r["own_ms"] for r in rows), 3),
        "top": rows[:top],
    }


def _short(filename: str) -> str:
    for marker in ("site-packages/", "operator/"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename


def measure_instructions(
    policies: Sequence[str], waiting: int, *, steps: int = MEASURED_STEPS
) -> dict[str, dict[str, Any]]:
    """Instructions and estimated cycles per measured step of each policy, counted by callgrind
    (module docstring), and each one's estimated cycles over the baseline's. ``policies`` must
    hold the baseline. Raises RuntimeError when callgrind cannot run here
    (:func:`callgrind.unavailable` says why).

    Each policy runs in its own child process (about 90 s each on the project's VM, most of it
    importing vLLM under valgrind), as many at once as the machine has cores: a count does not
    depend on what else runs (FCFS's and PEEK's passes at 50 waiting counted within 0.05% of
    their counts alone, inside the 0.2% spread between runs), and two policies take half the
    time (107 s against 176 s one after the other on two cores)."""
    if BASELINE not in policies:
        raise ValueError(f"the instruction counts need the {BASELINE} baseline among the policies")
    env = {**os.environ, "PYTHONHASHSEED": "0"}

    def count(policy: str) -> callgrind.Counts:
        return callgrind.count(
            [sys.executable, "-m", __name__, policy, str(waiting), str(steps)], env
        )

    with ThreadPoolExecutor(max(1, min(len(policies), os.cpu_count() or 1))) as pool:
        counts = dict(zip(policies, pool.map(count, policies), strict=True))
    base = counts[BASELINE].estimated_cycles
    return {
        policy: {
            "ir_per_step": round(c.ir / steps),
            "cycles_per_step": round(c.estimated_cycles / steps),
            "x_fcfs_cycles": round(c.estimated_cycles / base, 4),
            "x_fcfs_ir": round(c.ir / counts[BASELINE].ir, 4),
        }
        for policy, c in counts.items()
    }


def _one_pass(
    scheduler_cls: type[Scheduler],
    waiting: int,
    steps: int,
    *,
    sim_step_s: float | None = None,
    markers: callgrind.Markers | None = None,
) -> dict[str, float]:
    """One pass (module docstring). ``sim_step_s``: time sibling holds with a simulated clock
    that advances this much per step instead of ``time.monotonic``; ``markers``: callgrind's
    markers (instrument before the warm-up, collect over the scheduler's calls of the measured
    steps). Only the scheduler's calls are timed and collected, plus the garbage collections
    that run between them (``gc_ms``): building the top-up's vLLM requests and the fake model
    output is the engine's and the model runner's work, the same for every policy, but a
    collection it sets off walks every young object, the scheduler's included."""
    scheduler = build_scheduler(scheduler_cls, ENGINE)
    # As vLLM's engine core does after start-up: collect, then keep the start-up heap out of
    # later collections. Earlier passes' garbage is collected here, not in this pass's steps.
    freeze_gc_heap()
    sim_clock = SimClock()
    if hasattr(scheduler, "use_clock"):
        scheduler.use_clock(time.monotonic if sim_step_s is None else sim_clock)
    marks = markers or callgrind.Markers(None)
    make = request_factory(ENGINE)
    counter = 0
    totals = {"schedule_ms": 0.0, "update_ms": 0.0, "add_ms": 0.0, "gc_ms": 0.0}
    measured = in_call = False
    gc_start_s = 0.0

    def timed(key: str, call: Callable[..., T], *args: Any) -> T:
        nonlocal in_call
        if not measured:
            return call(*args)
        in_call = True  # first: the markers toggle, so a collection must not start them again
        marks.start()
        t0 = time.process_time()
        result = call(*args)
        totals[key] += 1000 * (time.process_time() - t0)
        marks.stop()
        in_call = False
        return result

    def collection(phase: str, _: dict[str, int]) -> None:
        # A collection the request or output building set off: it walks the scheduler's
        # objects too, so it is the step's cost (one inside a scheduler call is timed there).
        nonlocal gc_start_s
        if not measured or in_call:
            return
        if phase == "start":
            marks.start()
            gc_start_s = time.process_time()
        else:
            totals["gc_ms"] += 1000 * (time.process_time() - gc_start_s)
            marks.stop()

    def top_up() -> None:
        nonlocal counter
        arrivals = [_request(i) for i in range(counter, counter + waiting - len(scheduler.waiting))]
        counter += len(arrivals)
        requests = [make(arrival, arrival.arrival_s) for arrival in arrivals]
        timed("add_ms", _add_all, scheduler, requests)

    top_up()
    marks.instrument()
    gc.callbacks.append(collection)
    try:
        for step in range(WARMUP_STEPS + steps):
            measured = step >= WARMUP_STEPS
            if sim_step_s is not None:
                sim_clock.now_s += sim_step_s
            output = timed("schedule_ms", scheduler.schedule)
            model_output = fabricate_output(output, scheduler)
            timed("update_ms", scheduler.update_from_output, output, model_output)
            top_up()
    finally:
        gc.callbacks.remove(collection)
    gc.unfreeze()
    per_step = {k: v / steps for k, v in totals.items()}
    per_step["total_ms"] = sum(per_step.values())
    return per_step


def _add_all(scheduler: Scheduler, requests: list[Request]) -> None:
    for request in requests:
        scheduler.add_request(request)


def _request(i: int) -> ReplayRequest:
    group = i // GROUP_SIZE
    return ReplayRequest(
        request_id=f"overhead-{i}",
        arrival_s=0.0,
        segments=(((NS_SYSTEM, 99, group), PREFIX_TOKENS), ((NS_QUESTION, 99, i), QUESTION_TOKENS)),
        output_tokens=OUTPUT_TOKENS,
        shares_prefix=True,
    )


def _counted_pass(argv: Sequence[str]) -> None:
    """``python -m prefixserving_lab.runners.replay_overhead POLICY WAITING STEPS``: the pass
    :func:`measure_instructions` counts, under callgrind's markers."""
    policy, waiting, steps = argv
    _one_pass(
        scheduler_class(policy),
        int(waiting),
        int(steps),
        sim_step_s=SIM_STEP_S,
        markers=callgrind.markers(),
    )


if __name__ == "__main__":
    _counted_pass(sys.argv[1:])
