"""Warm-up curves (``prefixserving_lab.runners.curves``): the bucketing by age on hand-computed
outcomes, the two ways to age requests, the report's table and the command-line checks."""

from __future__ import annotations

import math

import pytest
from click.testing import CliRunner

from prefixserving.cli import main
from prefixserving_lab.models.cluster import Outcome
from prefixserving_lab.reports.curves import curve_table
from prefixserving_lab.runners.curves import (
    CurveBucket,
    CurveSpec,
    ages_since,
    ages_since_first_request,
    curve,
)


def _outcome(
    index: int,
    arrival_s: float,
    ttft_s: float | None,
    hit: int,
    backend: str | None = "e-0",
    tokens: int = 100,
) -> Outcome:
    return Outcome(index, arrival_s, backend, None, ttft_s, hit, tokens)


def test_curve_buckets_by_age_with_hand_computed_figures() -> None:
    outcomes = [
        # bucket 0 [0, 30): TTFT 1, 2, 3 -> p50 2, p99 2 + 0.98 * (3 - 2); hits 10+20+30 of 300
        _outcome(0, 100.0, 3.0, 10),
        _outcome(1, 110.0, 1.0, 20),
        _outcome(2, 129.5, 2.0, 30),
        # bucket 2 [60, 70): one served (TTFT 4), one never served; hits 50 of 200
        _outcome(3, 160.0, 4.0, 50),
        _outcome(4, 169.0, None, 0),
        # outside the span: before the event, and at its end
        _outcome(5, 99.0, 9.0, 100),
        _outcome(6, 170.0, 9.0, 100),
    ]
    spec = CurveSpec(span_s=70.0, bucket_s=30.0)
    first, empty, last = curve(ages_since(outcomes, 100.0), spec)

    assert (first.start_s, first.end_s, first.requests) == (0.0, 30.0, 3)
    assert first.ttft_p50_s == 2.0
    assert first.ttft_p99_s == pytest.approx(2.98)
    assert first.hit_rate == pytest.approx(60 / 300)

    assert (empty.start_s, empty.end_s, empty.requests) == (30.0, 60.0, 0)
    assert math.isnan(empty.ttft_p50_s) and math.isnan(empty.hit_rate)
    assert empty.summary()["ttft_p99_s"] is None

    assert (last.start_s, last.end_s, last.requests) == (60.0, 70.0, 2)  # cut at the span
    assert last.ttft_p50_s == last.ttft_p99_s == 4.0
    assert last.hit_rate == pytest.approx(50 / 200)

    # A report re-read from the JSON gets the same buckets back (None as NaN again).
    back = CurveBucket.from_summary(empty.summary())
    assert (back.start_s, back.end_s, back.requests) == (30.0, 60.0, 0)
    assert math.isnan(back.ttft_p50_s) and math.isnan(back.hit_rate)
    assert CurveBucket.from_summary(last.summary()) == last


def test_new_replicas_are_aged_from_their_own_first_request() -> None:
    outcomes = [
        _outcome(0, 5.0, 0.1, 0, backend="seeded"),
        _outcome(1, 12.0, 0.1, 0, backend="new-b"),
        _outcome(2, 10.0, 0.1, 0, backend="new-a"),
        _outcome(3, 50.0, 0.1, 0, backend="new-a"),
        _outcome(4, 45.0, 0.1, 0, backend="new-b"),
        _outcome(5, 20.0, None, 0, backend=None),
    ]
    aged = ages_since_first_request(outcomes, ["new-a", "new-b"])
    assert sorted((o.index, age) for age, o in aged) == [(1, 0.0), (2, 0.0), (3, 40.0), (4, 33.0)]
    [first, second] = curve(aged, CurveSpec(span_s=60.0, bucket_s=30.0))
    assert (first.requests, second.requests) == (2, 2)


def test_curve_spec_refuses_an_interval_longer_than_the_curve() -> None:
    with pytest.raises(ValueError, match="bucket_s <= span_s"):
        CurveSpec(span_s=60.0, bucket_s=90.0)
    with pytest.raises(ValueError, match="0 < bucket_s"):
        CurveSpec(span_s=60.0, bucket_s=0.0)


def test_curve_table_has_one_row_per_interval_and_the_runs_side_by_side() -> None:
    spec = CurveSpec(span_s=90.0, bucket_s=30.0)
    cold = curve(ages_since([_outcome(0, 0.0, 1.5, 25)], 0.0), spec)
    warm = curve(ages_since([_outcome(0, 31.0, 0.5, 75)], 0.0), spec)
    lines = curve_table({"cold": cold, "warmed": warm}).splitlines()
    assert lines[0].startswith("| minutes | cold n | cold TTFT p50 s | cold TTFT p99 s | cold hit")
    assert "| warmed n | warmed TTFT p50 s | warmed TTFT p99 s | warmed hit |" in lines[0]
    assert lines[2:] == [
        "| 0-0.5 | 1 | 1.500 | 1.500 | 0.250 | 0 | - | - | - |",
        "| 0.5-1 | 0 | - | - | - | 1 | 0.500 | 0.500 | 0.750 |",
        "| 1-1.5 | 0 | - | - | - | 0 | - | - | - |",
    ]
    with pytest.raises(ValueError, match="same intervals"):
        curve_table({"cold": cold, "short": cold[:2]})


@pytest.mark.parametrize("command", ["scaling", "rollout"])
def test_curve_options_refuse_bad_values_naming_the_option(command: str) -> None:
    longer = ["bench", command, "--curve-minutes", "1", "--curve-bucket-s", "90"]
    result = CliRunner().invoke(main, longer)
    assert result.exit_code == 2
    assert "--curve-bucket-s 90 is longer than --curve-minutes 1" in result.output
    result = CliRunner().invoke(main, ["bench", command, "--curve-minutes", "0"])
    assert result.exit_code == 2 and "--curve-minutes" in result.output
