"""``cluster.json`` and ``cluster.md`` from the cluster benchmark's rows and verdicts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from prefixserving_lab.machine import machine_line
from prefixserving_lab.models.peer_routers import follows_kv_events
from prefixserving_lab.reports.files import write_results
from prefixserving_lab.runners.cluster import (
    BALANCE_GOAL,
    BALANCE_TOLERANCE,
    CHALLENGER,
    HIT_GOAL,
    LEAD_FROM_ROUTERS,
    OUR_POLICIES,
    OURS,
    OURS_EVENTS,
    PEERS,
    SCALING_TOLERANCE,
    EventsVerdict,
    RunRow,
    ScalingVerdict,
    Verdict,
    events_verdicts,
    scaling_verdicts,
)

NOTES = [
    "## Reading the results",
    "",
    "- routers = 1: one router sees every request. routers > 1: router replicas behind a"
    " Service, each seeing a share of the requests and keeping its own state, as deployed"
    " (the operator runs 2 by default). SGLang-style trees and two-choice's last-choice memory"
    " are per-router state, so with more routers each learns from less of the traffic."
    " prefix-affinity's ranking is a function of the prefix; its traffic shares (which every"
    " router estimates alike from its half) set how deep the key goes, how many replicas a"
    " hot prefix spreads over and each key's load bound, and its load bound compares the"
    " engines' own request counts, which every router scrapes alike. With one router,"
    " two-choice and SGLang-style place each new conversation by load and remember where;"
    " prefix-affinity keeps no memory of placements (that is what lets replicas agree), so a"
    " new conversation either stays on its hashed replica however loaded or moves and misses"
    " on its next turn; it cannot match them there without the engines' events (below).",
    "- More router replicas: prefix-affinity's ranking is the same on every router, but each"
    " router estimates traffic shares (key depth, per-key load bound) from its own 1/R of the"
    " requests, so at R = 8 its estimates take 8 times as many cluster requests to settle and"
    " stay noisier; more requests spill while they do, mostly early in the trace. Peers lose"
    " more: their placement memory is per router, so each router places each conversation"
    " afresh.",
    "- Engine events (prefix_affinity_events): the same policy, given per replica how many of"
    " the request's leading blocks its cache holds, as its KV cache events tell a router (every"
    " router replica receives the same events). It follows the replica that holds more of the"
    " request than any other (a conversation's history, also where an earlier turn spilled)"
    " and places a request no replica leads on by load between its first two ranks; the"
    " events are the memory of where it went, shared by every router replica, so on the"
    " Mooncake trace 8 routers keep 99.6% of one router's hit rate where the plain policy"
    " keeps 97.1-97.7%.",
    "- Shared-prefix groups lose at 4 and 8 routers with or without events, in the warm-up:"
    " each router estimates the traffic shares (which documents are hot, over how many"
    " replicas they spread) from 1/R of the requests, so they settle later. Over the first"
    " quarter of the requests, N = 8, our hit rate is 77.5% with one router and 71.6% with"
    " eight (with events 78.7% and 67.4%); over the last quarter 90.2% and 90.1% (with events"
    " 90.1% and 90.1%). With events and 8 routers, the load-based choice of a new request"
    " also reads engine counts one scrape (1 s) old and herds: with a 0.1 s scrape the"
    " N = 8, 8-router case reaches 85.9% instead of 83.9%.",
    "- KubeAI-style hashes the first block only: when every request starts with the same"
    " system prompt (shared-prefix groups), one replica is everyone's first choice and the"
    " load bound scatters the rest.",
    "- Moved requests lose their cached prefix on the replica they land on, so every point of"
    " moved traffic costs hit rate; the bound trades that against queueing (TTFT p99)."
    " prefix-affinity moves heavy prefixes first (a moved heavy prefix warms its next replica"
    " and stays there) and keeps a light one (one conversation) home up to twice the mean"
    " load, so bursts of light conversations queue longer (TTFT p99).",
    "- Hash placement depends on the replica names (pod names in a cluster); other names move"
    " the hashing policies' figures by about one point of hit rate and a few hundredths of"
    " max/mean, so smaller differences are noise.",
    "",
]


def write_cluster_results(
    out_dir: Path,
    rows: Sequence[RunRow],
    verdicts: Sequence[Verdict],
    meta: Mapping[str, Any],
    name: str = "cluster",
) -> tuple[Path, Path]:
    """Write ``<name>.json`` and ``<name>.md`` into ``out_dir``; return their paths."""
    data = {
        **meta,
        "rows": [asdict(r) for r in rows],
        "verdicts": [{**asdict(v), "met": v.met} for v in verdicts],
        "scaling_verdicts": [{**asdict(v), "met": v.met} for v in scaling_verdicts(rows)],
        "events_verdicts": [{**asdict(v), "met": v.met} for v in events_verdicts(rows)],
    }
    return write_results(out_dir, name, data, render_markdown(rows, verdicts, meta))


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def _spilled(row: RunRow) -> str:
    total = sum(row.decisions.values())
    moved = row.decisions.get("spilled", 0) + row.decisions.get("fallback", 0)
    return _pct(moved / total) if total else "-"


def render_markdown(
    rows: Sequence[RunRow], verdicts: Sequence[Verdict], meta: Mapping[str, Any]
) -> str:
    lines = [
        "# Cluster routing simulation",
        "",
        f"Command: `{meta['command']}`",
        f"Machine: {machine_line(meta['machine'])} (a deterministic simulation: the figures"
        f" do not depend on the machine; wall time {meta['wall_s']:.0f} s).",
        f"Replica model: {meta['service']}.",
        f"Fleet sizing per workload and N: cache blocks per replica = ceil({BALANCE_GOAL} x"
        " distinct blocks / N); time scale = compression that keeps prefill servers "
        f"{_pct(meta['utilization'])} busy at the ideal hit rate (explicit values override).",
        "Hit rate: share of prompt tokens served from cache; ideal: one unbounded cache."
        " Max/mean: requests per replica (prefill seconds per replica in brackets)."
        " Moved: requests not sent to the policy's first choice (spilled or fallback).",
        *_events_line(rows, meta),
        "",
    ]
    for workload in dict.fromkeys(r.workload for r in rows):
        subset = [r for r in rows if r.workload == workload]
        lines += [
            f"## {workload} (ideal hit rate {_pct(subset[0].ideal_hit_rate)})",
            "",
            "| N | routers | policy | hit rate | of ideal | max/mean | TTFT p50 | TTFT p99 "
            "| moved | time scale | cache blocks |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in subset:
            name = f"**{r.policy}**" if r.policy in OUR_POLICIES else r.policy
            lines.append(
                f"| {r.replicas} | {r.routers} | {name} | {_pct(r.hit_rate)} | "
                f"{_pct(r.hit_vs_ideal)} | {r.max_mean_requests:.2f} ({r.max_mean_prefill:.2f}) | "
                f"{r.ttft_p50_s:.2f} s | {r.ttft_p99_s:.2f} s | {_spilled(r)} | "
                f"{r.time_scale:.2f}x | {r.cache_blocks} |"
            )
        lines.append("")
    lines += _goal_section(rows, verdicts)
    lines += _scaling_section(rows, scaling_verdicts(rows))
    lines += _events_section(events_verdicts(rows))
    lines += _two_choice_section(rows, verdicts, meta.get("deployed_routers", 0))
    lines += NOTES
    return "\n".join(lines) + "\n"


def _events_line(rows: Sequence[RunRow], meta: Mapping[str, Any]) -> list[str]:
    """How the rows run with engine events saw the caches (when there are any)."""
    if not any(follows_kv_events(r.policy) for r in rows) or "kv_event_lag_s" not in meta:
        return []
    return [
        "Engine events: each replica's cache changes reach every router replica"
        f" {1000 * meta['kv_event_lag_s']:.0f} ms (simulated) after they happen."
    ]


def _why(v: Verdict, ours: RunRow) -> str:
    hit = f"hit {_pct(ours.hit_vs_ideal)} of ideal"
    parts = [hit + ("" if v.hit_goal_met else f" (< {_pct(HIT_GOAL)}; {_spilled(ours)} moved)")]
    if v.balance_goal_met:
        parts.append(f"max/mean {ours.max_mean_requests:.2f}")
    else:
        parts.append(f"max/mean {ours.max_mean_requests:.3f} (> {BALANCE_GOAL})")
    if v.behind:
        parts.append("behind " + ", ".join(v.behind))
    return "; ".join(parts)


def _goal_section(rows: Sequence[RunRow], verdicts: Sequence[Verdict]) -> list[str]:
    lines = [
        "## Goal: prefix-affinity",
        "",
        f"Per case: hit rate >= {_pct(HIT_GOAL)} of ideal; max/mean requests <= {BALANCE_GOAL};"
        " and no other policy with a higher hit rate among those balanced as well (max/mean"
        f" <= {BALANCE_GOAL} or <= ours); a policy that buys hit rate with worse balance than"
        " both is listed in the tables but not counted.",
        "",
        "| workload | N | routers | goal | why |",
        "|---|---|---|---|---|",
    ]
    for v in verdicts:
        ours = next(
            r
            for r in rows
            if (r.workload, r.replicas, r.routers, r.policy)
            == (v.workload, v.replicas, v.routers, OURS)
        )
        lines.append(
            f"| {v.workload} | {v.replicas} | {v.routers} | {'met' if v.met else 'missed'} | "
            f"{_why(v, ours)} |"
        )
    met = sum(v.met for v in verdicts)
    lines += ["", f"Goal met in {met} of {len(verdicts)} cases.", ""]
    return lines


def _scaling_section(rows: Sequence[RunRow], verdicts: Sequence[ScalingVerdict]) -> list[str]:
    """Issue 18's goal for router replicas; only when the run has R = 1 and some R > 1."""
    judged = list(verdicts)
    if not judged:
        return []
    by_case = {(r.workload, r.replicas, r.routers, r.policy): r for r in rows}
    peers = [p for p in PEERS if any(r.policy == p for r in rows)]
    lines = [
        "## Goal: router replicas",
        "",
        f"Per case with R > 1 router replicas, for prefix-affinity with and without engine"
        f" events: a hit rate at least {_pct(1 - SCALING_TOLERANCE)} of the same policy's with"
        f" one router (same workload and N), and from {LEAD_FROM_ROUTERS} routers higher than"
        " every peer's ("
        + ", ".join(peers)
        + ") at the same R. Each request goes to a router replica chosen at random; every"
        " router replica keeps its own policy state (with engine events, all of them receive"
        " the same events).",
        "",
        "| workload | N | routers | ours | hit rate | of 1 router | "
        + " | ".join(peers)
        + " | goal |",
        "|---|---|---|---|---|---|" + "---|" * len(peers) + "---|",
    ]
    for v in judged:
        ours = by_case[(v.workload, v.replicas, v.routers, v.policy)]
        cells = []
        for peer in peers:
            row = by_case.get((v.workload, v.replicas, v.routers, peer))
            cells.append(_pct(row.hit_rate) if row else "-")
        why = "met" if v.met else "missed"
        if not v.within_goal_met:
            why += f" (< {_pct(1 - SCALING_TOLERANCE)} of 1 router)"
        if v.behind:
            why += " (behind " + ", ".join(v.behind) + ")"
        lines.append(
            f"| {v.workload} | {v.replicas} | {v.routers} | {v.policy} | {_pct(ours.hit_rate)} | "
            f"{_pct(v.of_one_router)} | " + " | ".join(cells) + f" | {why} |"
        )
    lines.append("")
    for policy in dict.fromkeys(v.policy for v in judged):
        mine = [v for v in judged if v.policy == policy]
        within = sum(v.within_goal_met for v in mine)
        lead = [v for v in mine if v.lead_judged]
        ahead = sum(not v.behind for v in lead)
        lines.append(
            f"- {policy}: within {_pct(SCALING_TOLERANCE)} of one router in {within} of"
            f" {len(mine)} cases; ahead of every peer from {LEAD_FROM_ROUTERS} routers in"
            f" {ahead} of {len(lead)} cases."
        )
    lines.append("")
    return lines


def _events_section(verdicts: Sequence[EventsVerdict]) -> list[str]:
    """Issue 18's engine-events goal at one router; only when the run has the rows."""
    if not verdicts:
        return []
    lines = [
        "## Goal: engine events at one router",
        "",
        f"Per workload and N with one router: {OURS_EVENTS} (prefix-affinity fed the engines'"
        f" KV cache events) at least {_pct(1 - SCALING_TOLERANCE)} of the best peer's hit rate.",
        "",
        "| workload | N | best peer | of best peer | goal |",
        "|---|---|---|---|---|",
    ]
    for v in verdicts:
        lines.append(
            f"| {v.workload} | {v.replicas} | {v.best_peer} | {_pct(v.of_best_peer)} | "
            f"{'met' if v.met else 'missed'} |"
        )
    met = sum(v.met for v in verdicts)
    lines += ["", f"Met in {met} of {len(verdicts)} cases.", ""]
    return lines


def _two_choice_section(
    rows: Sequence[RunRow], verdicts: Sequence[Verdict], deployed_routers: int
) -> list[str]:
    """Issue 8's rule: two-choice becomes the default only if it wins on hit rate at equal
    balance. Judged per router count; the default follows the deployed router count."""
    judged = [v for v in verdicts if v.two_choice_wins is not None]
    if not judged:
        return []
    by_case = {(r.workload, r.replicas, r.routers, r.policy): r for r in rows}
    lines = [
        "## Default algorithm: two-choice vs prefix-affinity",
        "",
        f"Cases where {CHALLENGER} has the higher hit rate at equal balance (max/mean within"
        f" {BALANCE_TOLERANCE} or better), and where it has the lower TTFT:",
        "",
        "| routers | two-choice wins on hit rate | lower TTFT p50 | lower TTFT p99 |",
        "|---|---|---|---|",
    ]
    wins_at: dict[int, tuple[int, int]] = {}
    for routers in sorted({v.routers for v in judged}):
        group = [v for v in judged if v.routers == routers]
        pairs = [
            (
                by_case[(v.workload, v.replicas, routers, OURS)],
                by_case[(v.workload, v.replicas, routers, CHALLENGER)],
            )
            for v in group
        ]
        wins = sum(bool(v.two_choice_wins) for v in group)
        wins_at[routers] = (wins, len(group))
        p50 = sum(c.ttft_p50_s < o.ttft_p50_s for o, c in pairs)
        p99 = sum(c.ttft_p99_s < o.ttft_p99_s for o, c in pairs)
        n = len(group)
        lines.append(f"| {routers} | {wins} of {n} | {p50} of {n} | {p99} of {n} |")
    basis = deployed_routers if deployed_routers in wins_at else None
    wins, total = (
        wins_at[basis]
        if basis
        else (
            sum(w for w, _ in wins_at.values()),
            sum(t for _, t in wins_at.values()),
        )
    )
    default = "two-choice" if wins > total / 2 else "prefix-affinity"
    where = f"with {basis} router replicas, the operator's default" if basis else "over all cases"
    lines += [
        "",
        f"Verdict ({where}: two-choice wins {wins} of {total}): the default should be"
        f" **{default}**.",
        "",
    ]
    return lines
