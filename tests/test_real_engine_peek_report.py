"""The real-engine PEEK benchmark's summary and options (``bench/real_engine_peek.py``), no
engines started."""

from __future__ import annotations

import click
import pytest
from bench.real_engine_peek import parse_peek_env, summarize


def row(scheduler: str, ttft_p50: float, tpot_p50: float, round_: int = 1) -> dict[str, object]:
    return {
        "kind": "chat",
        "round": round_,
        "scheduler": scheduler,
        "ttft_p50_ms": ttft_p50,
        "ttft_p99_ms": ttft_p50 * 1.2,
        "tpot_p50_ms": tpot_p50,
        "tpot_p99_ms": tpot_p50,
        "hit_rate": 0.45,
        "prompt_tokens_computed": 314,
    }


def test_ratios_favour_peek_above_one_and_the_goal_reads_them() -> None:
    summary = summarize([row("stock", 60.0, 4.0), row("peek", 30.0, 2.0)])
    assert summary["ttft_p50_ratio"] == 2.0 and summary["tpot_p50_ratio"] == 2.0
    assert summary["goal_met"] is True


def test_a_tpot_of_zero_gives_no_ratio_instead_of_a_division_by_zero() -> None:
    """On busy cores a 4-token answer reached the client in one chunk (TPOT 0 ms): the smoke
    run of the benchmark failed with ZeroDivisionError."""
    summary = summarize([row("stock", 32.2, 2.7), row("peek", 35.6, 0.0)])
    assert summary["tpot_p50_ratio"] is None and summary["tpot_p99_ratio"] is None
    assert summary["ttft_p50_ratio"] == round(32.2 / 35.6, 3)
    assert summary["goal_met"] is False


def test_one_slow_round_does_not_decide_the_goal() -> None:
    """Four paired rounds; in one the machine slowed stock threefold. The means would give
    PEEK a 1.6x lower p50 (the goal); the median of the paired ratios says 1.2x (missed)."""
    stock = [41.0, 38.0, 40.0, 110.0]
    peek = [35.0, 44.0, 30.0, 30.0]
    rows = [row("stock", s, 3.0, n) for n, s in enumerate(stock)]
    rows += [row("peek", p, 3.0, n) for n, p in enumerate(peek)]
    assert sum(stock) / sum(peek) > 1.5
    summary = summarize(rows)
    assert summary["ttft_p50_ratio"] == round((41 / 35 + 40 / 30) / 2, 3)
    assert summary["rounds_peek_ttft_p50_lower"] == 3
    assert summary["hit_rate_ratio"] == 1.0 and summary["tpot_p50_ratio"] == 1.0
    assert summary["goal_met"] is False


def test_peek_settings_for_the_peek_engine_are_checked_before_any_engine_starts() -> None:
    assert parse_peek_env(("PREFIXSERVING_REORDER_ON_BACKLOG=true",)) == {
        "PREFIXSERVING_REORDER_ON_BACKLOG": "true"
    }
    with pytest.raises(click.BadParameter, match="PREFIXSERVING_REORDER_ON_BACKLOG"):
        parse_peek_env(("PREFIXSERVING_REORDER_ON_BACKLOG=sometimes",))
    with pytest.raises(click.BadParameter, match="NAME=VALUE"):
        parse_peek_env(("VLLM_CPU_KVCACHE_SPACE=4",))
