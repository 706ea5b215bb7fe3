"""Goal evaluation and ratios of the replay report (pure functions, no vLLM run)."""

from __future__ import annotations

from prefixserving_lab.reports import replay as report


def metrics(hit: float, p50: float, p99: float, cold_p99: float | None, rps: float) -> dict:
    return {
        "hit_rate": hit,
        "ttft_s": {"p50": p50, "p90": p99, "p99": p99},
        "cold_ttft_s": {} if cold_p99 is None else {"p99": cold_p99},
        "throughput_rps": rps,
    }


def goals_by_key(rows: list[dict]) -> dict[tuple[str, str], bool]:
    return {(g["goal"], g["scope"]): g["met"] for g in rows}


def test_goals_met_and_missed() -> None:
    sharing = {
        "name": "s",
        "runs": {
            "fcfs": metrics(0.2, 14.0, 30.0, 40.0, 1.0),
            "peek": metrics(0.6, 1.5, 29.0, 41.0, 1.0),
            "sglang_lpm": metrics(0.61, 2.0, 60.0, 90.0, 1.0),
        },
    }
    control = {
        "name": "c",
        "runs": {
            "fcfs": metrics(0.0, 1.0, 5.0, 5.0, 2.0),
            "peek": metrics(0.0, 1.01, 5.0, 5.0, 2.0),
        },
    }
    overhead = [
        {"policy": "fcfs", "waiting": 1000, "total_ms": 10.0},
        {"policy": "peek", "waiting": 1000, "total_ms": 11.5},
    ]
    got = goals_by_key(report.goals([sharing, control], overhead, ["s"], ["c"]))
    assert got[("hit_rate_2.6x", "s")] is True  # 3x
    assert got[("ttft_p50_7x", "s")] is True  # 9.3x
    assert got[("beats_baselines", "s")] is False  # LPM's hit rate is higher
    assert got[("p99_not_worse", "s")] is False  # cold p99 41 > 40
    assert got[("control_2pct", "c")] is True
    assert got[("p99_not_worse", "c")] is True
    assert got[("overhead_10pct", "1000 waiting")] is False  # x1.15


def test_ratios_are_relative_to_fcfs() -> None:
    runs = {"fcfs": metrics(0.2, 10.0, 20.0, None, 1.0), "peek": metrics(0.5, 2.0, 10.0, None, 2.0)}
    r = report.ratios(runs)
    assert r["peek"]["hit_rate"] == 2.5 and r["peek"]["ttft_p50"] == 0.2
    assert r["peek"]["cold_ttft_p99"] is None and r["fcfs"]["throughput"] == 1.0
