"""The one percentile definition (``prefixserving_lab.stats.quantile``) and that every
benchmark's percentiles use it."""

from __future__ import annotations

import math
import random
from collections import Counter

import numpy as np
import pytest

from prefixserving_lab.models.cluster import ClusterResult, Outcome
from prefixserving_lab.runners.replay_metrics import percentiles
from prefixserving_lab.stats import quantile


def test_quantile_interpolates_between_closest_ranks() -> None:
    values = [40.0, 10.0, 30.0, 20.0]  # sorted: 10, 20, 30, 40; position (n - 1) * q
    assert quantile(values, 0.0) == 10.0
    assert quantile(values, 1.0) == 40.0
    assert quantile(values, 0.5) == 25.0  # halfway between 20 and 30
    assert quantile(values, 0.9) == pytest.approx(37.0)  # 30 + 0.7 * (40 - 30)
    assert quantile([7.0], 0.99) == 7.0


def test_quantile_is_numpys_default_on_any_sample() -> None:
    rng = random.Random(3)
    for n in (1, 2, 3, 10, 101, 1000):
        values = [rng.expovariate(1.0) for _ in range(n)]
        for q in (0.0, 0.01, 0.25, 0.5, 0.9, 0.99, 1.0):
            assert quantile(values, q) == float(np.quantile(values, q))


def test_quantile_of_nothing_is_nan_and_q_is_checked() -> None:
    assert math.isnan(quantile([], 0.5))
    with pytest.raises(ValueError, match=r"q must be in \[0, 1\]"):
        quantile([1.0], 99)


def test_the_simulators_and_the_replay_use_the_same_definition() -> None:
    """Four TTFTs where nearest rank (the simulators' old definition) and interpolation differ:
    the cluster result's p50 and the replay's p50 are both the interpolated 2.5 s."""
    ttfts = [1.0, 2.0, 3.0, 4.0]
    outcomes = [Outcome(i, 0.0, "r", "affinity", t, 0, 1) for i, t in enumerate(ttfts)]
    result = ClusterResult(outcomes, {}, [], Counter(), 0.0)
    assert result.ttft_quantile(0.5) == 2.5
    assert percentiles(ttfts, (50,)) == {"p50": 2.5}
