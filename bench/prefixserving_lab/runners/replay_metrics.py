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
- ``longest_sibling_wait_s``: from the policy's own stats when it reports one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from prefixserving_lab.stats import quantile

if TYPE_CHECKING:  # the replay imports vLLM; these figures need only its records
    from prefixserving_lab.runners.replay import ReplayRun

SIBLING_WAIT_KEYS = ("longest_sibling_wait_s", "max_sibling_wait_s")


def percentiles(values: Sequence[float], qs: Sequence[int] = (50, 90, 99)) -> dict[str, float]:
    """``{"p50": ..., ...}`` of ``values``, rounded to 4 digits (empty dict when there are
    none)."""
    if not values:
        return {}
    return {f"p{q}": round(quantile(values, q / 100), 4) for q in qs}


def summarize(run: ReplayRun) -> dict[str, Any]:
    """The metrics of ``run`` (module docstring), as a JSON-ready dict."""
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
