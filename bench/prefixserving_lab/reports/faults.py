"""``faults.json`` and ``faults.md`` from the fault benchmark's series."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from prefixserving_lab.machine import machine_line
from prefixserving_lab.reports.files import write_results
from prefixserving_lab.runners.cluster import OURS
from prefixserving_lab.runners.faults import DIP_LIMIT_S, DIP_RATIO, FaultSeries, Misses

SERIES_MINUTES = 10


def write_fault_results(
    out_dir: Path, runs: Mapping[str, Sequence[FaultSeries]], meta: Mapping[str, Any]
) -> tuple[Path, Path]:
    """Write ``faults.json`` and ``faults.md``; ``runs``: policy -> its series."""
    data = {
        **meta,
        "runs": {
            policy: [{**asdict(s), "met": s.met} for s in series] for policy, series in runs.items()
        },
    }
    return write_results(out_dir, "faults", data, render_markdown(runs, meta))


def _pct(value: float) -> str:
    return "-" if math.isnan(value) else f"{100 * value:.1f}%"


def _misses(misses: Misses) -> str:
    return f"{misses.extra_uncached_tokens / 1e6:.2f} M ({misses.unheld_tokens / 1e6:.2f} M)"


def render_markdown(runs: Mapping[str, Sequence[FaultSeries]], meta: Mapping[str, Any]) -> str:
    setup = meta["setup"]
    lines = [
        "# Faults in the cluster simulation",
        "",
        f"Command: `{meta['command']}`",
        f"Machine: {machine_line(meta['machine'])} (a deterministic simulation: the figures"
        f" do not depend on the machine; wall time {meta['wall_s']:.0f} s).",
        f"Workload: {meta['workload']} at {meta['time_scale']}x its pace; replica model:"
        f" {meta['service']}.",
        f"Fleet: {setup['replicas']} engine pods behind {setup['routers']} router replicas"
        " (each request to one chosen at random), pods load for"
        f" {setup['lifecycle']['load_s']:.0f} s and warm up"
        f" ({'on' if setup['lifecycle']['warmup'] else 'off'}). Fault at"
        f" {setup['fault_s']:.0f} s: router-restart (router 0 loses its state), engines-out"
        f" ({setup['engines_out']} pods removed, the Deployment scaled back"
        f" {setup['out_for_s']:.0f} s later), rolling-update (surge 1, unavailable 0; each new"
        " pod warms what the pod it replaces holds and takes its routing identity: the warm-up"
        " handover) and"
        " rolling-update-no-handover (the same with `spec.warmup.handover: false`).",
        f"Goal: after the fault, the hit rate of no run of {setup['bucket_s']:.0f} s buckets"
        f" stays below {_pct(DIP_RATIO)} of the steady run's (same requests, no fault) for"
        f" longer than {DIP_LIMIT_S:.0f} s.",
        "",
        "Extra uncached: prompt tokens computed beyond the steady run's on the same requests,"
        " after the fault and in the longest dip; in brackets those of the steady run's hits"
        " that no Ready pod held when the request was routed (gone with a removed pod, or"
        " evicted), which no placement could have hit.",
        "Longest dip, best placement: the same dip had each request gone to the Ready pod that"
        " held the most of it when it was routed (a bound for any router after the fault,"
        " given what the fleet cached; it cannot undo where requests went before the fault).",
        "",
        "| policy | scenario | hit rate after fault (steady) | lowest bucket, of steady |"
        " longest dip | longest dip, best placement | TTFT p99 after (steady) |"
        " extra uncached after (no pod held) | in the dip (no pod held) | goal |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for policy, series in runs.items():
        name = f"**{policy}**" if policy == OURS else policy
        for s in series:
            if s.scenario == "steady":
                continue
            lines.append(
                f"| {name} | {s.scenario} | {_pct(s.hit_rate_after)}"
                f" ({_pct(s.steady_hit_rate_after)}) | {_pct(s.lowest_of_steady)} |"
                f" {s.longest_dip_s:.0f} s | {s.best_placement_dip_s:.0f} s |"
                f" {s.ttft_p99_after_s:.2f} s"
                f" ({s.steady_ttft_p99_after_s:.2f} s) | {_misses(s.misses_after)} |"
                f" {_misses(s.misses_in_dip)} | {'met' if s.met else 'missed'} |"
            )
    lines += ["", *_series_section(runs.get(OURS, ()), setup), *NOTES]
    return "\n".join(lines) + "\n"


def _series_section(series: Sequence[FaultSeries], setup: Mapping[str, Any]) -> list[str]:
    if not series:
        return []
    bucket_s, start = setup["bucket_s"], setup["fault_s"]
    end = start + 60 * SERIES_MINUTES
    lines = [
        f"## {OURS} over time: hit rate of steady per {bucket_s:.0f} s bucket, from the fault",
        "",
    ]
    for s in series:
        if s.scenario == "steady":
            continue
        shown = [b for b in s.buckets if start <= b.start_s < end]
        lines.append(f"- {s.scenario}: " + " ".join(_pct(b.of_steady) for b in shown))
        lines.append(
            f"- {s.scenario}, best placement: " + " ".join(_pct(b.best_of_steady) for b in shown)
        )
    return [*lines, ""]


NOTES = [
    "## Reading the results",
    "",
    "- A router restart costs prefix-affinity nothing when its ranking does not depend on"
    " learnt state (no prefix is hot enough to be split): the restarted replica ranks"
    " engines as before from its first request. Peers that remember placements per router"
    " place each conversation afresh on the restarted replica.",
    "- Removing engines takes what they cached with them and moves the keys they owned to"
    " others: the tokens in brackets (held by no Ready pod when the request was routed) are"
    " that loss, plus whatever was evicted. Pods added back are new pods (new names): under"
    " rendezvous hashing each takes its share of keys from every engine, a second dip; they"
    " warm only the hot prefixes they own, not every conversation. Peers that remember"
    " placements keep conversations where they are and move only the removed engines' ones.",
    "- A rolling update replaces every pod in turn (a pod's load time plus warm-up per step,"
    " so it can outlast the trace). Without the handover each step moves the old pod's keys"
    " and the new pod's share of everyone's, about 2/N of the keys, so the dip repeats for"
    " the whole rollout. With it the new pod inherits the old pod's routing identity and"
    " takes exactly its place in every ranking: 1/N of the keys move, all to a pod that"
    " replayed the old pod's hot prefixes.",
    "- With engine events (prefix_affinity_events), a request whose prefix one engine holds"
    " beyond the others goes there, so keys that a join or a removal moves in the ranking stay"
    " where they are cached, and a new pod takes only new conversations. What is lost is what"
    " the removed pods held.",
    "- The warm-up handover (rolling-update against rolling-update-no-handover): each new pod"
    " also replays the hot prefixes of the pod it replaces (`replaces` of the router's"
    " hot-prefix endpoint) and inherits its routing identity (the router's `--identity-port`)."
    " The rendezvous policies (prefix-affinity, two-choice) rank by identities, so they send"
    " the replaced pod's keys to the new pod, with or without engine events; without the"
    " handover those keys go to their next choice in the ranking, spread over every pod."
    " Peers run the same warm-up and handover here (the sidecar is this project's), with"
    " their own policy deciding which prefixes a new pod owns; they have no identities.",
    "",
]
