"""Summary metrics of one replay run.

- ``hit_rate``: sum of cached prompt tokens at each request's first admission / sum of prompt
  tokens; ``vllm_hit_rate``: the same from vLLM's own prefix-cache counters (hits / queries
  of non-preempted admissions); the two must agree (``hit_rate_matches_vllm``).
- ``prefill_tokens``: prompt tokens computed, recomputation after preemption included.
- TTFT percentiles (simulated seconds, :func:`prefixserving_lab.stats.quantile`) over all
  requests and over the requests that share nothing (``cold_*``; absent when a workload has
  none).
- ``throughput_rps`` / ``output_tokens_per_s``: finished requests and output tokens per
  simulated second, from the first arrival to the last finish.
- ``tpot_s``: time per output token, per request ``(finish - first token) / (output tokens
  - 1)`` over the requests with two or more output tokens; percentiles as for TTFT.
- ``goodput_rps``: requests per simulated second whose TTFT meets the workload's SLO
  (:func:`ttft_slo_s`), over the same span as throughput; ``slo_attainment``: their share.
- ``preemptions``: requests vLLM preempted (summed over steps).
- ``longest_sibling_wait_s``: from the policy's own stats when it reports one.

Every metric is a function of the simulation alone, so a replay of the same workload with the
same scheduler and vLLM reproduces it exactly, except ``MACHINE_METRICS`` (CPU and wall time of
the machine that ran it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from prefixserving_lab.models.cost import CostModel, StepShape
from prefixserving_lab.stats import quantile

if TYPE_CHECKING:  # the replay and workloads import vLLM; these figures need only records
    from prefixserving_lab.runners.replay import ReplayRun
    from prefixserving_lab.workloads.segments import Workload

SIBLING_WAIT_KEYS = ("longest_sibling_wait_s", "max_sibling_wait_s")
MACHINE_METRICS = ("schedule_cpu_ms_per_step", "wall_s")
# Goodput's TTFT SLO, as a multiple of the median prompt's prefill on an idle engine.
TTFT_SLO_FACTOR = 3.0


def ttft_slo_s(workload: Workload, cost: CostModel) -> float:
    """The TTFT SLO of ``workload`` under ``cost``: ``TTFT_SLO_FACTOR`` x the time its median
    prompt takes to prefill with nothing cached on an idle engine (chunks of the step token
    budget, each step's base cost and context read included). Cost: O(requests log
    requests)."""
    prompt = sorted(r.prompt_tokens for r in workload.requests)[len(workload.requests) // 2]
    budget = workload.engine.max_num_batched_tokens
    threshold = workload.engine.long_prefill_token_threshold
    chunk = min(budget, threshold) if threshold else budget
    idle_s = sum(
        cost.step_s(StepShape(prefill_tokens=min(chunk, prompt - done), context_tokens=done))
        for done in range(0, prompt, chunk)
    )
    return round(TTFT_SLO_FACTOR * idle_s, 4)


def percentiles(values: Sequence[float], qs: Sequence[int] = (50, 90, 99)) -> dict[str, float]:
    """``{"p50": ..., ...}`` of ``values``, rounded to 4 digits (empty dict when there are
    none)."""
    if not values:
        return {}
    return {f"p{q}": round(quantile(values, q / 100), 4) for q in qs}


def summarize(run: ReplayRun, slo_s: float) -> dict[str, Any]:
    """The metrics of ``run`` (module docstring), with goodput against the TTFT SLO
    ``slo_s``, as a JSON-ready dict."""
    records = run.records
    unfinished = [r.request_id for r in records if r.finish_s is None or r.cached_tokens is None]
    if unfinished:
        raise ValueError(f"{run.policy} on {run.workload}: {len(unfinished)} requests unfinished")
    prompt = sum(r.prompt_tokens for r in records)
    cached = sum(r.cached_tokens or 0 for r in records)
    hit_rate = cached / prompt if prompt else 0.0
    vllm_hit_rate = run.vllm_hits / run.vllm_queries if run.vllm_queries else 0.0
    ttft = [r.ttft_s for r in records if r.ttft_s is not None]
    cold = [r.ttft_s for r in records if not r.shares_prefix and r.ttft_s is not None]
    tpot = [
        (r.finish_s - r.first_token_s) / (r.output_tokens - 1)
        for r in records
        if r.output_tokens >= 2 and r.finish_s is not None and r.first_token_s is not None
    ]
    good = sum(1 for t in ttft if t <= slo_s)
    start = min(r.arrival_s for r in records)
    end = max(r.finish_s or 0.0 for r in records)
    span = max(end - start, 1e-9)
    out: dict[str, Any] = {
        "policy": run.policy,
        "requests": len(records),
        "hit_rate": round(hit_rate, 4),
        "vllm_hit_rate": round(vllm_hit_rate, 4),
        "hit_rate_matches_vllm": abs(hit_rate - vllm_hit_rate) < 1e-9 and cached == run.vllm_hits,
        "prefill_tokens": run.prefill_tokens,
        "ttft_s": percentiles(ttft),
        "cold_ttft_s": percentiles(cold),
        "cold_requests": len(cold),
        "tpot_s": percentiles(tpot),
        "ttft_slo_s": slo_s,
        "goodput_rps": round(good / span, 4),
        "slo_attainment": round(good / max(1, len(records)), 4),
        "throughput_rps": round(len(records) / span, 4),
        "output_tokens_per_s": round(sum(r.output_tokens for r in records) / span, 2),
        "makespan_s": round(span, 3),
        "steps": run.steps,
        "idle_steps": run.idle_steps,
        "preemptions": run.preemptions,
        "schedule_cpu_ms_per_step": round(
            1000 * run.schedule_cpu_s / max(1, run.steps + run.idle_steps), 4
        ),
        "wall_s": round(run.wall_s, 2),
        "longest_sibling_wait_s": next(
            (run.policy_stats[k] for k in SIBLING_WAIT_KEYS if k in run.policy_stats), None
        ),
        "policy_stats": run.policy_stats,
    }
    return out
