"""The one percentile definition of every benchmark and report.

:func:`quantile` is linear interpolation between closest ranks, numpy's default (Hyndman and
Fan's definition 7, also ``statistics.quantiles(method="inclusive")``): for ``n`` sorted values
``x[0] <= ... <= x[n-1]`` and ``0 <= q <= 1``, take the position ``h = (n - 1) * q`` and return
``x[floor(h)] + (h - floor(h)) * (x[floor(h) + 1] - x[floor(h)])``. ``q = 0`` is the minimum,
``q = 1`` the maximum, ``q = 0.5`` the median; with one value every quantile is that value.
Cost: O(n log n) for the sort.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def quantile(values: Iterable[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (module docstring); NaN when there are none.

    ``ValueError`` when ``q`` is outside [0, 1].
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q}")
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (position - low) * (ordered[high] - ordered[low])
