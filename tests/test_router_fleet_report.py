"""The router-fleet benchmark's report (``bench/router_fleet_real.py``), without engines.

The benchmark runs real routers and engines (its smoke run is in ``test_bench_smoke.py``);
these tests check the figures it computes from a run's raw record and the page it writes.
"""

from __future__ import annotations

from typing import Any

import pytest
from bench.router_fleet_real import RUNS, goals, markdown, summarize, tolerance, workload_for

MACHINE = {"cores": 2, "cpu": "Test CPU", "load_average_1m": 1.25, "python": "3.11.7"}


def attempt(router: int, engine: int | None, ok: bool = True, ttft_s: float = 0.1) -> dict:
    return {
        "router": router,
        "engine": engine,
        "ok": ok,
        "ttft_s": ttft_s if ok else None,
        "error": None if ok else "RemoteProtocolError: Server disconnected",
    }


def raw(name: str, routers: int, requests: list[dict], hits: float, **extra: Any) -> dict:
    served = [sum(r["attempts"][-1]["engine"] == e for r in requests) for e in (0, 1)]
    engines = [
        {
            "prefix_cache_hits_total": hits / 2,
            "prefix_cache_queries_total": 500.0,
            "request_success_total": float(n),
        }
        for n in served
    ]
    return {"name": name, "routers": routers, "engines": engines, "requests": requests, **extra}


def request(group: int, *attempts: dict) -> dict:
    return {"group": group, "attempts": list(attempts)}


def test_agreement_counts_groups_whose_served_requests_all_reached_one_engine() -> None:
    requests = [
        request(0, attempt(0, 0, ttft_s=0.1)),
        request(0, attempt(1, 0, ttft_s=0.2)),  # group 0: two routers, one engine
        request(1, attempt(0, 1, ttft_s=0.3)),
        request(1, attempt(2, 0, ttft_s=0.4)),  # group 1: two routers, two engines
        request(2, attempt(2, 1, ttft_s=0.5)),  # group 2: one router, one engine
    ]
    s = summarize(raw("3 routers", 3, requests, hits=600.0), groups=3)

    assert s["hit_rate"] == pytest.approx(0.6)
    assert s["requests_per_engine"] == [3.0, 2.0]
    assert s["agreement"] == pytest.approx(2 / 3)
    assert s["groups_via_several_routers"] == 2
    assert s["agreement_via_several_routers"] == pytest.approx(0.5)
    assert s["ttft_p50_ms"] == pytest.approx(300.0)
    assert s["failed"] == 0 and "stop" not in s


def test_a_stopped_router_reports_its_failures_and_the_retries_that_served_them() -> None:
    requests = [
        request(0, attempt(0, 0)),
        request(0, attempt(1, None, ok=False), attempt(0, 0)),  # failed on 1, retry served
        request(1, attempt(1, None, ok=False), attempt(2, None, ok=False)),  # retry failed too
        request(1, attempt(1, 1)),  # sent to router 1 before the signal, served
    ]
    stop = {
        "signal": "SIGKILL",
        "router": 1,
        "sent_before": 3,
        "in_flight_at_signal": 2,
        "exit_code": -9,
        "exit_s": 0.01,
    }
    killed = raw("killed", 3, requests, hits=0.0, stop_record=stop, announced=False)
    s = summarize(killed, groups=2)

    assert s["failed"] == 2 and s["failed_after_retry"] == 1
    assert s["first_error"].startswith("RemoteProtocolError")
    assert s["stop"]["requests_on_it"] == 3 and s["stop"]["failed_on_it"] == 2
    assert s["stop"]["retried"] == 2 and s["stop"]["served_by_retry"] == 1
    # Group 1 has one served request only: it reached one engine.
    assert s["agreement"] == 1.0
    text = markdown(result([s]))
    assert (
        "router 1 got SIGKILL after 3 of 4 requests were sent, with 2 in flight on it; "
        "the client kept sending to it until a request there failed. 3 requests" in text
    )
    assert "2 failed requests once more to another router: 1 served, 1 still failed" in text


def test_tolerance_is_one_requests_full_shared_blocks_over_the_runs_prompt_tokens() -> None:
    w = workload_for(groups=16, per_group=6, prefix_tokens=512, seed=0)
    assert tolerance(w) == pytest.approx(512 / (96 * 544))
    # A prefix of 300 tokens has two full 128-token blocks.
    assert tolerance(workload_for(2, 2, 300, 0)) == pytest.approx(256 / (4 * 332))


def summary(name: str, hit_rate: float, failed: int = 0) -> dict[str, Any]:
    return {"name": name, "hit_rate": hit_rate, "failed": failed}


@pytest.mark.parametrize(
    ("three", "failed", "hit_met", "term_met"),
    [(0.70, 0, True, True), (0.69, 0, True, True), (0.68, 1, False, False)],
)
def test_goals_compare_three_routers_with_one_and_count_sigterm_failures(
    three: float, failed: int, hit_met: bool, term_met: bool
) -> None:
    runs = [summary(RUNS[0].name, 0.70), summary(RUNS[1].name, three)]
    runs.append(summary(RUNS[2].name, 0.70, failed))
    g = goals(runs, tol=0.0101)
    assert g["hit_rate_met"] is hit_met and g["sigterm_met"] is term_met
    assert g["hit_rate_difference"] == pytest.approx(three - 0.70)
    assert g["sigterm_failed"] == failed


def result(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    w = workload_for(groups=2, per_group=2, prefix_tokens=512, seed=0)
    return {
        "machine": MACHINE,
        "load_average_1m_end": 1.5,
        "workload": {"groups": 2, "per_group": 2, "prefix_len": 512, "suffix_len": 32},
        "ideal_token_hit_rate": w.ideal_hit_rate(128),
        "goals": {
            "tolerance": 0.01,
            "hit_rate_difference": -0.004,
            "hit_rate_met": True,
            "sigterm_failed": 0,
            "sigterm_met": True,
        },
        "runs": summaries,
    }


def test_the_page_has_a_row_per_run_and_the_goal_line() -> None:
    requests = [request(0, attempt(0, 0)), request(1, attempt(0, 1))]
    s = summarize(raw("1 router", 1, requests, hits=500.0), groups=2)
    text = markdown(result([s]))

    row = next(line for line in text.splitlines() if line.startswith("| 1 router |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells == ["1 router", "50.0%", "1 / 1", "100%", "0", "100", "100", "0"]
    assert "-0.4 points from 1 router's (tolerance 1.0%" in text
    assert "**met**" in text and "SIGTERM: 0: **met**" in text
    assert text.startswith("# Prefix routers in front of real engines")
    assert "\nMachine: 2 cores, Test CPU" in text
