"""Goal evaluation and ratios of the replay report (pure functions, no vLLM run)."""

from __future__ import annotations

from prefixserving_lab.reports import replay as report


def metrics(
    hit: float,
    p50: float,
    p99: float,
    cold_p99: float | None,
    rps: float,
    goodput: float = 0.5,
    tpot: float = 0.02,
) -> dict:
    return {
        "hit_rate": hit,
        "ttft_s": {"p50": p50, "p90": p99, "p99": p99},
        "cold_ttft_s": {} if cold_p99 is None else {"p99": cold_p99},
        "throughput_rps": rps,
        "goodput_rps": goodput,
        "tpot_s": {"p50": tpot, "p99": 2 * tpot},
    }


def goals_by_key(rows: list[dict]) -> dict[tuple[str, str], bool]:
    return {(g["goal"], g["scope"]): g["met"] for g in rows}


def test_goals_met_and_missed() -> None:
    sharing = {
        "name": "s@0.8",
        "role": "sharing",
        "runs": {
            "fcfs": metrics(0.2, 14.0, 30.0, 40.0, 1.0, goodput=0.2, tpot=0.020),
            "peek": metrics(0.6, 1.5, 29.0, 41.0, 1.0, goodput=0.9, tpot=0.023),
            "sglang_lpm": metrics(0.61, 2.0, 60.0, 90.0, 1.0, goodput=0.8),
            "sglang_hrrn": metrics(0.5, 3.0, 28.0, 30.0, 1.0, goodput=0.7),
        },
    }
    beaten = {
        "name": "b",
        "role": "sharing",
        "runs": {
            "fcfs": metrics(0.2, 4.0, 30.0, None, 1.0, goodput=0.5),
            "peek": metrics(0.3, 1.0, 20.0, None, 1.0, goodput=0.6, tpot=0.021),
            "sglang_spf": metrics(0.3, 0.9, 25.0, None, 1.0, goodput=0.7),
        },
    }
    control = {
        "name": "c",
        "role": "control",
        "runs": {
            "fcfs": metrics(0.0, 1.0, 5.0, 5.0, 2.0),
            "peek": metrics(0.0, 1.01, 5.0, 5.0, 2.0),
        },
    }
    ranking = {"name": "r", "role": "other", "runs": sharing["runs"]}
    overhead = [
        {"policy": "fcfs", "waiting": 1000, "total_ms": 10.0, "x_fcfs": 1.0},
        # best rounds x1.08, but the median of the paired rounds (what counts) x1.15
        {"policy": "peek", "waiting": 1000, "total_ms": 10.8, "x_fcfs": 1.15},
    ]
    rows = report.goals([sharing, beaten, control, ranking], overhead)
    got = goals_by_key(rows)
    assert got[("hit_rate_best", "s@0.8")] is False  # LPM's 0.61 is higher
    assert got[("ttft_p50_best", "s@0.8")] is True
    assert got[("ttft_p99_fcfs_hrrn", "s@0.8")] is False  # 29 > HRRN's 28
    assert got[("goodput_best", "s@0.8")] is True
    assert got[("tpot_p50_1.1x", "s@0.8")] is False  # x1.15
    assert got[("hit_rate_best", "b")] is True  # a tie with the best is met
    assert got[("ttft_p50_best", "b")] is False and got[("goodput_best", "b")] is False
    assert got[("ttft_p99_fcfs_hrrn", "b")] is True  # no HRRN run: FCFS only
    assert got[("tpot_p50_1.1x", "b")] is True
    assert got[("control_2pct", "c")] is True
    assert got[("overhead_10pct", "1000 waiting")] is False  # x1.15
    assert ("overhead_10pct_cycles", "1000 waiting") not in got  # not counted in this run
    assert not any(scope == "r" for _, scope in got)  # ranking-only workloads have no goals
    summary = {g["goal"]: (g["met"], g["rows"]) for g in report.goal_summary(rows)}
    assert summary["hit_rate_best"] == (1, 2) and summary["control_2pct"] == (1, 1)
    assert {g["policy"] for g in rows} == {"peek"}


def test_each_peek_setting_gets_goals_and_none_is_a_baseline_of_another() -> None:
    """A variant (here with the best hit rate and p50) is a candidate: PEEK's goals compare it
    with the baselines only, and the variant gets its own rows, shown in a column each."""
    sharing = {
        "name": "s@1.2",
        "role": "sharing",
        "runs": {
            "fcfs": metrics(0.2, 14.0, 30.0, None, 1.0, goodput=0.2, tpot=0.020),
            "peek": metrics(0.6, 1.5, 29.0, None, 1.0, goodput=0.9, tpot=0.030),
            "peek_no_reserve": metrics(0.7, 1.0, 29.0, None, 1.0, goodput=0.9, tpot=0.021),
            "sglang_hrrn": metrics(0.5, 3.0, 28.0, None, 1.0, goodput=0.7),
        },
    }
    control = {
        "name": "c",
        "role": "control",
        "runs": {
            "fcfs": metrics(0.0, 1.0, 5.0, 5.0, 2.0),
            "peek": metrics(0.0, 1.0, 5.0, 5.0, 2.0),
            "peek_no_reserve": metrics(0.0, 1.1, 5.0, 5.0, 2.0),
        },
    }
    rows = report.goals([sharing, control], [])
    by = {(g["policy"], g["goal"], g["scope"]): g["met"] for g in rows}
    assert by["peek", "hit_rate_best", "s@1.2"] is True  # the variant is not a baseline
    assert by["peek", "ttft_p50_best", "s@1.2"] is True
    assert by["peek", "tpot_p50_1.1x", "s@1.2"] is False  # x1.5
    assert by["peek_no_reserve", "tpot_p50_1.1x", "s@1.2"] is True
    assert by["peek_no_reserve", "ttft_p99_fcfs_hrrn", "s@1.2"] is False  # HRRN's 28
    assert by["peek", "control_2pct", "c"] is True
    assert by["peek_no_reserve", "control_2pct", "c"] is False  # p50 10% off
    assert not any(p == "sglang_hrrn" for p, _, _ in by)
    summary = {(g["policy"], g["goal"]): (g["met"], g["rows"]) for g in report.goal_summary(rows)}
    assert summary["peek_no_reserve", "tpot_p50_1.1x"] == (1, 1)
    table = report._goal_tables(rows)
    assert table[2] == "| goal | peek | peek_no_reserve |"
    assert "| tpot_p50_1.1x | 0 / 1 | 1 / 1 |" in table


def test_ratios_are_relative_to_fcfs() -> None:
    runs = {"fcfs": metrics(0.2, 10.0, 20.0, None, 1.0), "peek": metrics(0.5, 2.0, 10.0, None, 2.0)}
    r = report.ratios(runs)
    assert r["peek"]["hit_rate"] == 2.5 and r["peek"]["ttft_p50"] == 0.2
    assert r["peek"]["cold_ttft_p99"] is None and r["fcfs"]["throughput"] == 1.0


def overhead_row(
    policy: str,
    waiting: int,
    total_ms: float,
    x_fcfs: float,
    gc_ms: float | None = 0.5,
    **counted: float,
):
    """One row of the overhead table: 1 ms each in schedule and update, ``gc_ms`` in
    collections between the calls (None: a file from before that column), the rest in add."""
    row = {
        "policy": policy,
        "waiting": waiting,
        "schedule_ms": 1.0,
        "update_ms": 1.0,
        "add_ms": total_ms - 2.0 - (gc_ms or 0.0),
        "total_ms": total_ms,
        "x_fcfs": x_fcfs,
        **counted,
    }
    return row if gc_ms is None else {**row, "gc_ms": gc_ms}


def test_counted_cycles_give_their_own_goal_row_and_table_columns() -> None:
    overhead = [
        overhead_row("fcfs", 100, 5.0, 1.0, gc_ms=None),
        overhead_row(
            "fcfs", 1000, 10.0, 1.0, cycles_per_step=30e6, x_fcfs_cycles=1.0, x_fcfs_ir=1.0
        ),
        overhead_row(
            "peek", 1000, 11.5, 1.15, cycles_per_step=31.5e6, x_fcfs_cycles=1.05, x_fcfs_ir=1.02
        ),
    ]
    rows = {(g["goal"], g["scope"]): g for g in report.goals([], overhead)}
    assert rows[("overhead_10pct", "1000 waiting")]["met"] is False  # CPU time x1.15
    cycles = rows[("overhead_10pct_cycles", "1000 waiting")]
    assert cycles["met"] is True  # x1.05
    assert "31.50 M" in cycles["detail"] and "instructions x1.020" in cycles["detail"]
    result = report.new_result(
        {},
        {
            "base_s": 0.01,
            "prefill_token_s": 0.0,
            "decode_seq_s": 0.0,
            "context_token_s": 0.0,
            "source": "test",
        },
    )
    result["overhead"] = overhead
    table = report.markdown(result)
    assert "| fcfs | 100 | 1.000 | 1.000 | 3.000 | - | 5.000 | 1.000 | - | - |" in table
    peek = "| peek | 1,000 | 1.000 | 1.000 | 9.000 | 0.500 | 11.500 | 1.150 | 31.50 | 1.050 |"
    assert peek in table


def test_the_scorecard_judges_every_policy_as_peek_is() -> None:
    """PEEK's card holds exactly its goal rows; a baseline is judged against the others (and
    itself, which always holds); PEEK's settings are never anyone's baseline."""
    policies = ("fcfs", "peek", "sglang_spf", "sglang_hrrn", "peek_no_reserve")
    at_08 = (
        metrics(0.2, 14.0, 30.0, None, 1.0, goodput=0.2, tpot=0.020),
        metrics(0.6, 1.5, 29.0, None, 1.0, goodput=0.9, tpot=0.023),
        # SPF: best at everything but beaten by PEEK's setting, which is not a baseline
        metrics(0.62, 1.0, 25.0, None, 1.0, goodput=1.0, tpot=0.021),
        metrics(0.5, 3.0, 28.0, None, 1.0, goodput=0.7),
        metrics(0.9, 0.1, 1.0, None, 1.0, goodput=5.0, tpot=0.01),
    )
    at_12 = (
        metrics(0.2, 9.0, 20.0, None, 1.0, goodput=0.3, tpot=0.020),
        metrics(0.7, 2.0, 19.0, None, 1.0, goodput=0.8, tpot=0.021),
        metrics(0.6, 1.0, 40.0, None, 1.0, goodput=1.2, tpot=0.030),
        metrics(0.5, 3.0, 18.0, None, 1.0, goodput=0.7),
        metrics(0.7, 2.0, 19.0, None, 1.0, goodput=0.8, tpot=0.021),
    )
    rows = [
        {"name": name, "role": "sharing", "runs": dict(zip(policies, runs, strict=True))}
        for name, runs in (("s@0.8", at_08), ("s@1.2", at_12))
    ]
    rows.append(
        {"name": "c", "role": "control", "runs": {"fcfs": metrics(0.0, 1.0, 5.0, 5.0, 2.0)}}
    )
    ranked = report.scorecard(rows)
    cards = {c["policy"]: c for c in ranked}
    goals = report.goal_summary(report.goals(rows, []))
    for policy in ("peek", "peek_no_reserve"):
        summary = {g["goal"]: g["met"] for g in goals if g["policy"] == policy}
        assert {goal: cards[policy][goal] for goal in report.SHARING_GOALS} == summary
    spf = cards["sglang_spf"]
    assert spf["all_five"] == 1 and spf["total"] == 5 + 3  # s@1.2: p99 40 s, TPOT x1.5
    fcfs = cards["fcfs"]
    assert fcfs["tpot_p50_1.1x"] == 2 and fcfs["ttft_p99_fcfs_hrrn"] == 0  # HRRN's p99 lower
    assert fcfs["hit_rate_best"] == 0 and fcfs["rows"] == 2
    hrrn = cards["sglang_hrrn"]
    assert hrrn["ttft_p99_fcfs_hrrn"] == 2  # SPF's lower p99 on s@0.8 is no reference
    assert [c["policy"] for c in ranked[:2]] == ["sglang_spf", "peek_no_reserve"]  # 8 and 7 rows
    table = "\n".join(report._scorecard_table(ranked))
    assert "| sglang_spf | 2 | 2 | 2 | 1 | 1 | 8 of 10 | 1 |" in table
