"""Results of a replay benchmark: ratios against FCFS, the issue's goals, JSON and markdown.

Goals checked for ``peek`` and each of its setting variants in the run (``PEEK_POLICIES``),
on every workload and load point (each row says met or missed, with the figures; "baselines"
are the run's other policies, FCFS included, never a PEEK setting):

- ``hit_rate_best`` (sharing): hit rate >= the best baseline's;
- ``ttft_p50_best`` (sharing): TTFT p50 <= the best baseline's;
- ``ttft_p99_fcfs_hrrn`` (sharing): TTFT p99 <= both FCFS's and SGLang HRRN's
  (``sglang_hrrn``, when it ran);
- ``goodput_best`` (sharing): goodput >= every baseline's;
- ``tpot_p50_1.1x`` (sharing): TPOT p50 <= 1.1 x FCFS's;
- ``control_2pct`` (the no-sharing control): TTFT p50 and p99 and throughput within 2 % of
  FCFS;
- ``overhead_10pct`` (``peek`` only): scheduler CPU time per step at 1,000 waiting <= 1.10 x
  FCFS;
- ``overhead_10pct_cycles``: the same bound on callgrind's estimated cycles per step (a
  deterministic count; :mod:`prefixserving_lab.runners.callgrind`), when they were counted.

Figures are compared as the results hold them (rounded to 4 digits).

**Scorecard** (:func:`scorecard`): the five sharing goals applied to *every* policy of the run,
each judged as PEEK is, against the same baselines. A comparison of a policy with itself always
holds, so the baselines need no exception. It says where PEEK ranks on the issue's own measure,
and which baseline would meet more of its goals than PEEK does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from operator import itemgetter
from pathlib import Path
from typing import Any

from prefixserving_lab.machine import machine, machine_line
from prefixserving_lab.models.schedulers.registry import BASELINE, PEEK_POLICIES
from prefixserving_lab.reports.files import write_results

CANDIDATE = "peek"
HRRN = "sglang_hrrn"
TPOT_GOAL = 1.10
CONTROL_TOLERANCE = 0.02
OVERHEAD_GOAL = 1.10
OVERHEAD_WAITING = 1000
EPS = 1e-9


def ratios(runs: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Per policy: hit rate, TTFT p50/p99, cold TTFT p99 and throughput over FCFS's."""
    base = runs.get(BASELINE)
    if base is None:
        return {}
    out = {}
    for policy, m in runs.items():
        out[policy] = {
            "hit_rate": _ratio(m["hit_rate"], base["hit_rate"]),
            "ttft_p50": _ratio(m["ttft_s"].get("p50"), base["ttft_s"].get("p50")),
            "ttft_p99": _ratio(m["ttft_s"].get("p99"), base["ttft_s"].get("p99")),
            "cold_ttft_p99": _ratio(m["cold_ttft_s"].get("p99"), base["cold_ttft_s"].get("p99")),
            "throughput": _ratio(m["throughput_rps"], base["throughput_rps"]),
        }
    return out


def _ratio(value: float | None, base: float | None) -> float | None:
    if value is None or base is None or base == 0:
        return None
    return round(value / base, 4)


def goals(
    workloads: Sequence[dict[str, Any]], overhead: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Evaluate the issue's goals for each PEEK setting of the run (module docstring); a
    workload's ``role`` says which apply."""
    rows: list[dict[str, Any]] = []
    for w in workloads:
        runs, name = w["runs"], w["name"]
        if BASELINE not in runs:
            continue
        baselines = {p: m for p, m in runs.items() if p not in PEEK_POLICIES}
        for candidate in (p for p in PEEK_POLICIES if p in runs):
            if w.get("role") == "sharing":
                rows += _sharing_goals(name, candidate, runs[candidate], baselines)
            elif w.get("role") == "control":
                rows.append(_control_goal(name, candidate, runs[candidate], runs[BASELINE]))
    at = {o["policy"]: o for o in overhead if o["waiting"] == OVERHEAD_WAITING}
    if CANDIDATE in at and BASELINE in at:
        x = at[CANDIDATE]["x_fcfs"]
        rows.append(
            _goal(
                "overhead_10pct",
                CANDIDATE,
                f"{OVERHEAD_WAITING} waiting",
                x <= OVERHEAD_GOAL,
                f"peek {at[CANDIDATE]['total_ms']:.3f} ms/step vs fcfs "
                f"{at[BASELINE]['total_ms']:.3f} ms/step (x{x:.3f}, median of paired rounds)",
            )
        )
        if "x_fcfs_cycles" in at[CANDIDATE] and "cycles_per_step" in at[BASELINE]:
            x = at[CANDIDATE]["x_fcfs_cycles"]
            rows.append(
                _goal(
                    "overhead_10pct_cycles",
                    CANDIDATE,
                    f"{OVERHEAD_WAITING} waiting",
                    x <= OVERHEAD_GOAL,
                    f"peek {at[CANDIDATE]['cycles_per_step'] / 1e6:.2f} M estimated cycles/step "
                    f"vs fcfs {at[BASELINE]['cycles_per_step'] / 1e6:.2f} M (x{x:.3f}; "
                    f"instructions x{at[CANDIDATE]['x_fcfs_ir']:.3f})",
                )
            )
    return rows


# The goals against the best baseline: (goal, figure of a run, higher is better, format).
BEST_OF_GOALS: tuple[tuple[str, Callable[[dict[str, Any]], float], bool, str], ...] = (
    ("hit_rate_best", lambda m: float(m["hit_rate"]), True, "{:.4f}"),
    ("ttft_p50_best", lambda m: float(m["ttft_s"]["p50"]), False, "{:.3f}s"),
    ("goodput_best", lambda m: float(m.get("goodput_rps", 0.0)), True, "{:.3f}/s"),
)
P99_GOAL_NAME = "ttft_p99_fcfs_hrrn"
TPOT_GOAL_NAME = "tpot_p50_1.1x"
# Every goal of a sharing row, in report order.
SHARING_GOALS = (*(goal for goal, *_ in BEST_OF_GOALS), P99_GOAL_NAME, TPOT_GOAL_NAME)


def _sharing_goals(
    name: str, candidate: str, mine: dict[str, Any], baselines: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    rows = []
    for goal, figure, higher, fmt in BEST_OF_GOALS:
        who = (max if higher else min)(baselines, key=lambda p: figure(baselines[p]))
        value, best = figure(mine), figure(baselines[who])
        met = value >= best - EPS if higher else value <= best + EPS
        detail = f"{candidate} {fmt.format(value)} vs best {who} {fmt.format(best)}"
        rows.append(_goal(goal, candidate, name, met, detail))
    refs = {p: baselines[p]["ttft_s"]["p99"] for p in (BASELINE, HRRN) if p in baselines}
    rows.append(
        _goal(
            P99_GOAL_NAME,
            candidate,
            name,
            all(mine["ttft_s"]["p99"] <= v + EPS for v in refs.values()),
            f"{candidate} {mine['ttft_s']['p99']:.3f}s vs "
            + ", ".join(f"{p} {v:.3f}s" for p, v in refs.items()),
        )
    )
    tpot = mine.get("tpot_s", {}).get("p50")
    base = baselines[BASELINE].get("tpot_s", {}).get("p50")
    if tpot is not None and base:
        rows.append(
            _goal(
                TPOT_GOAL_NAME,
                candidate,
                name,
                tpot <= TPOT_GOAL * base + EPS,
                f"{candidate} {1e3 * tpot:.2f} ms vs fcfs {1e3 * base:.2f} ms (x{tpot / base:.3f})",
            )
        )
    return rows


def _control_goal(
    name: str, candidate: str, mine: dict[str, Any], fcfs: dict[str, Any]
) -> dict[str, Any]:
    devs = {
        "ttft_p50": _dev(mine["ttft_s"]["p50"], fcfs["ttft_s"]["p50"]),
        "ttft_p99": _dev(mine["ttft_s"]["p99"], fcfs["ttft_s"]["p99"]),
        "throughput": _dev(mine["throughput_rps"], fcfs["throughput_rps"]),
    }
    return _goal(
        "control_2pct",
        candidate,
        name,
        all(d <= CONTROL_TOLERANCE for d in devs.values()),
        ", ".join(f"{k} {100 * d:.2f}%" for k, d in devs.items()),
    )


def goal_summary(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per PEEK setting and goal: how many of its rows are met, out of how many."""
    key = itemgetter("policy", "goal")
    total, met = Counter(map(key, rows)), Counter(key(g) for g in rows if g["met"])
    return [
        {"policy": policy, "goal": goal, "met": met[policy, goal], "rows": n}
        for (policy, goal), n in total.items()
    ]


def scorecard(workloads: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per policy of the run: its sharing rows meeting each of ``SHARING_GOALS`` against the
    run's baselines (module docstring), its total, and the rows where it meets all five; most
    goal rows first. O(policies x rows x policies)."""
    met: dict[str, Counter[str]] = {}
    all_five: Counter[str] = Counter()
    rows = 0
    for w in workloads:
        runs = w["runs"]
        if w.get("role") != "sharing" or BASELINE not in runs:
            continue
        rows += 1
        baselines = {p: m for p, m in runs.items() if p not in PEEK_POLICIES}
        for policy, mine in runs.items():
            goal_rows = _sharing_goals(w["name"], policy, mine, baselines)
            met.setdefault(policy, Counter()).update(g["goal"] for g in goal_rows if g["met"])
            all_five[policy] += all(g["met"] for g in goal_rows)
    cards = [
        {
            "policy": policy,
            **{goal: counts[goal] for goal in SHARING_GOALS},
            "total": sum(counts.values()),
            "all_five": all_five[policy],
            "rows": rows,
        }
        for policy, counts in met.items()
    ]
    return sorted(cards, key=lambda c: (-c["total"], c["policy"]))


def over_budget(overhead: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """PEEK's worst queue depth when its CPU time per step exceeds ``OVERHEAD_GOAL`` x FCFS
    there (the depth to profile), else None."""
    worst: dict[str, Any] | None = None
    for o in overhead:
        ratio = o["x_fcfs"]
        if o["policy"] != CANDIDATE or ratio <= OVERHEAD_GOAL:
            continue
        if worst is None or ratio > worst["ratio"]:
            worst = {"policy": CANDIDATE, "waiting": o["waiting"], "ratio": round(ratio, 3)}
    return worst


def _dev(value: float, base: float) -> float:
    return abs(value / base - 1) if base else 0.0


def _goal(goal: str, policy: str, scope: str, met: bool, detail: str) -> dict[str, Any]:
    return {"goal": goal, "policy": policy, "scope": scope, "met": met, "detail": detail}


def write(out_dir: Path, name: str, result: dict[str, Any]) -> tuple[Path, Path]:
    """Write ``<name>.json`` and ``<name>.md`` into ``out_dir``; return both paths."""
    return write_results(out_dir, name, result, markdown(result))


def new_result(settings: dict[str, Any], cost: dict[str, Any]) -> dict[str, Any]:
    return {
        "benchmark": "replay",
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "settings": settings,
        "cost_model": cost,
        "workloads": [],
        "overhead": [],
        "goals": [],
        "notes": [],
    }


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1e3 * seconds:.1f}"


def markdown(result: dict[str, Any]) -> str:
    """The results as a short markdown report (tables per workload, goals, overhead)."""
    m = result["machine"]
    cost = result["cost_model"]
    lines = [
        "# Replay benchmark: vLLM's real scheduler, simulated clock",
        "",
        f"Generated {result['created']} by `prefixserving bench replay`; options: "
        + ", ".join(f"{k}={v}" for k, v in result["settings"].get("options", {}).items())
        + ".",
        "",
        f"Machine: {machine_line(m)}, at the start. The figures below are simulated seconds,"
        " which other jobs on the machine do not change; only the CPU-time overhead table is"
        " sensitive to them.",
        "",
        f"Cost model per step: {cost['base_s'] * 1e3:.3f} ms + "
        f"{cost['prefill_token_s'] * 1e6:.3f} us/prefill token + "
        f"{cost['decode_seq_s'] * 1e3:.3f} ms/decode sequence + "
        f"{cost['context_token_s'] * 1e9:.3f} ns/context token. Source: {cost['source']}",
        "",
    ]
    if result["goals"]:
        lines += _goal_tables(result["goals"])
    cards = scorecard(result["workloads"])
    if cards:
        lines += _scorecard_table(cards)
    if result["overhead"]:
        lines += _overhead_table(result["overhead"])
    if result.get("overhead_profile"):
        lines += _profile_table(result["overhead_profile"])
    if result["notes"]:
        lines += ["## Notes", ""] + [f"- {n}" for n in result["notes"]] + [""]
    for w in result["workloads"]:
        lines += _workload_table(w)
    return "\n".join(lines)


def _goal_tables(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Rows met per goal (a column per PEEK setting of the run), then every row."""
    summary = goal_summary(rows)
    policies = list(dict.fromkeys(g["policy"] for g in summary))
    cells = {(g["policy"], g["goal"]): f"{g['met']} / {g['rows']}" for g in summary}
    lines = ["## Goals (PEEK): rows met", ""]
    lines += ["| goal | " + " | ".join(policies) + " |", "|---" * (len(policies) + 1) + "|"]
    for goal in dict.fromkeys(g["goal"] for g in summary):
        lines.append(
            f"| {goal} | " + " | ".join(cells.get((p, goal), "-") for p in policies) + " |"
        )
    lines += ["", "## Goals (PEEK), row by row", ""]
    if len(policies) == 1:
        lines += ["| goal | scope | met | figures |", "|---|---|---|---|"]
    else:
        lines += ["| goal | policy | scope | met | figures |", "|---|---|---|---|---|"]
    for g in rows:
        policy = f" {g['policy']} |" if len(policies) > 1 else ""
        lines.append(
            f"| {g['goal']} |{policy} {g['scope']} | {'met' if g['met'] else 'MISSED'} | "
            f"{g['detail']} |"
        )
    return [*lines, ""]


def _scorecard_table(cards: Sequence[dict[str, Any]]) -> list[str]:
    rows = cards[0]["rows"]
    lines = [
        "## Scorecard: PEEK's sharing goals applied to every policy",
        "",
        f"Rows met of {rows} sharing rows per goal, each policy judged against the run's"
        " baselines as PEEK is (PEEK's settings are never baselines; a comparison with itself"
        " always holds); `all five`: rows where it meets every goal.",
        "",
        "| policy | " + " | ".join(SHARING_GOALS) + " | total | all five |",
        "|---" * (len(SHARING_GOALS) + 3) + "|",
    ]
    for c in cards:
        goals = " | ".join(str(c[goal]) for goal in SHARING_GOALS)
        lines.append(
            f"| {c['policy']} | {goals} | {c['total']} of {len(SHARING_GOALS) * rows} | "
            f"{c['all_five']} |"
        )
    return [*lines, ""]


def _workload_table(w: dict[str, Any]) -> list[str]:
    e = w["engine"]
    lines = [
        f"## {w['name']}",
        "",
        f"{w['description']}. {w['requests']} requests ({w['cold_requests']} share nothing), "
        f"ideal hit rate {w['ideal_hit_rate']:.3f}; cache {e['num_blocks']} blocks of "
        f"{e['block_size']} tokens, max_num_seqs {e['max_num_seqs']}, budget "
        f"{e['max_num_batched_tokens']} tokens/step; TTFT SLO {_fmt(w.get('ttft_slo_s'))} s.",
        "",
        "| policy | hit rate | x FCFS | prefill tokens | TTFT p50 s | p90 s | p99 s | "
        "p50 x FCFS | p99 x FCFS | cold p99 s | TPOT p50 ms | p99 ms | goodput/s | req/s | "
        "preempt | sibling wait s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    rat = w.get("ratios", {})
    for policy, r in w["runs"].items():
        x = rat.get(policy, {})
        lines.append(
            f"| {policy} | {r['hit_rate']:.3f} | {_fmt(x.get('hit_rate'), 2)} | "
            f"{r['prefill_tokens']:,} | {_fmt(r['ttft_s'].get('p50'))} | "
            f"{_fmt(r['ttft_s'].get('p90'))} | {_fmt(r['ttft_s'].get('p99'))} | "
            f"{_fmt(x.get('ttft_p50'), 3)} | {_fmt(x.get('ttft_p99'), 3)} | "
            f"{_fmt(r['cold_ttft_s'].get('p99'))} | {_ms(r.get('tpot_s', {}).get('p50'))} | "
            f"{_ms(r.get('tpot_s', {}).get('p99'))} | {_fmt(r.get('goodput_rps'))} | "
            f"{r['throughput_rps']:.3f} | {r['preemptions']} | "
            f"{_fmt(r['longest_sibling_wait_s'])} |"
        )
    lines.append("")
    return lines


def _overhead_table(overhead: Sequence[dict[str, Any]]) -> list[str]:
    lines = [
        "## Scheduler CPU time per step",
        "",
        "CPU ms per step of the engine's calls on the scheduler (add_request for arrivals, "
        "schedule, update_from_output) and of the garbage collections between them (set off "
        "while the engine builds requests, they walk the scheduler's objects too; building "
        "requests and model outputs is not counted), best of the repeats; x FCFS is the median "
        "over the repeats of the policy's total over FCFS's in the same round. The last two "
        "columns (where counted) are callgrind's estimated cycles per step of the same work, "
        "one pass each with a simulated clock: within 0.2% on every run of the same code, "
        "however busy the machine.",
        "",
        "| policy | waiting | schedule ms | update ms | add ms | gc ms | total ms | x FCFS | "
        "M est. cycles | x FCFS (cycles) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for o in overhead:
        cycles = o.get("cycles_per_step")
        lines.append(
            f"| {o['policy']} | {o['waiting']:,} | {o['schedule_ms']:.3f} | "
            f"{o['update_ms']:.3f} | {o['add_ms']:.3f} | "
            f"{_fmt(o.get('gc_ms'))} | {o['total_ms']:.3f} | "
            f"{_fmt(o['x_fcfs'])} | {'-' if cycles is None else f'{cycles / 1e6:.2f}'} | "
            f"{_fmt(o.get('x_fcfs_cycles'))} |"
        )
    lines.append("")
    return lines


def _profile_table(prof: dict[str, Any]) -> list[str]:
    lines = [
        f"## Profile: {prof['policy']} at {prof['waiting']:,} waiting (x{prof['ratio']} FCFS)",
        "",
        f"cProfile of one pass (set-up and request creation included): "
        f"{prof['total_ms']:,.0f} ms in all, {prof['focus_own_ms']:,.0f} ms of it in PEEK's own "
        "code (prefixserving.peek and engine/vllm.py); its functions by own time:",
        "",
        "| function | calls | own ms | cumulative ms |",
        "|---|---|---|---|",
    ]
    for row in prof["top"]:
        lines.append(
            f"| `{row['function']}` | {row['calls']} | {row['own_ms']:.1f} | "
            f"{row['cumulative_ms']:.1f} |"
        )
    lines.append("")
    return lines
