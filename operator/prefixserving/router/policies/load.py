"""Load scoring and the bounded-load rule shared by the policies.

**Load of one backend**: ``max(in_flight, running + waiting_weight * waiting) + kv_weight *
kv_usage``. ``in_flight`` is exact and current but counts only this router's requests;
``running`` and ``waiting`` come from the engine's last ``/metrics`` scrape (at most a scrape
interval old) and count every router replica's requests. With one router the two counts are
the same requests and the larger is usually the fresher one; with several, the engine's count
is the larger, and it is the same number in every router, so router replicas compare the same
loads and agree (with only their own in-flight counts each sees a different, partial load).
A full KV cache counts as ``kv_weight`` (2) requests.

**Bounded load** (Mirrokni, Thorup, Zadimoghaddam, "Consistent Hashing with Bounded Loads",
SODA 2018): a backend may take one more request while
``load < max(ceil(load_bound * m), m + slack)`` with ``m = (total + 1) / N`` the mean load
after this request, ``total`` the sum of all ``N`` backends' loads. With ``slack = 0`` this is
the paper's ``load + 1 <= ceil(c * m)`` for integer loads; the slack keeps small absolute
gaps (a few requests) from counting as overload. The least-loaded backend is always within
the bound.

**Fallbacks**: a decision lists the backends to retry on after its choice, best first; the
policies order the ones that are not their preference by load (:func:`by_load`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prefixserving import constants
from prefixserving.router.policies.base import BackendLoad
from prefixserving.router.policies.key_choice import PrefixKeyParams

_IDLE = BackendLoad()


@dataclass(frozen=True, slots=True)
class LoadWeights:
    """Weights of the scraped signals in a backend's load (see the module docstring)."""

    waiting_weight: float = 1.0
    kv_weight: float = 2.0

    def of(self, load: BackendLoad) -> float:
        engine = load.running + self.waiting_weight * load.waiting
        return max(float(load.in_flight), engine) + self.kv_weight * load.kv_usage


def load_values(
    backends: Sequence[str], loads: Mapping[str, BackendLoad], weights: LoadWeights
) -> dict[str, float]:
    """Load of every backend; a backend missing from ``loads`` is idle."""
    return {b: weights.of(loads.get(b, _IDLE)) for b in backends}


def load_capacity(values: Mapping[str, float], load_bound: float, slack: float = 0.0) -> float:
    """A backend whose load is below this may take one more request."""
    total = sum(values.values())
    mean_after = (total + 1.0) / max(len(values), 1)
    return max(float(math.ceil(load_bound * mean_after)), mean_after + slack)


def all_waiting_at_least(
    loads: Mapping[str, BackendLoad], backends: Sequence[str], waiting: float
) -> bool:
    """Whether every one of ``backends`` has at least ``waiting`` requests waiting at its last
    scrape (the endpoint picker sheds a request then). O(N)."""
    return all(loads.get(b, _IDLE).waiting >= waiting for b in backends)


def by_load(values: Mapping[str, float], order: Sequence[str]) -> list[str]:
    """``order`` sorted by load, least loaded first; ties keep their order in ``order`` (a
    stable sort). O(N log N)."""
    return sorted(order, key=values.__getitem__)


@dataclass(frozen=True, slots=True)
class AffinityLoadParams(PrefixKeyParams):
    """Key choice plus the bounded-load rule, shared by the affinity policies' configs:
    ``load_bound`` (1.25), ``load_slack`` (4.0), ``waiting_weight`` (1.0), ``kv_weight`` (2.0)."""

    load_bound: float = constants.ROUTER_LOAD_BOUND
    load_slack: float = 4.0
    waiting_weight: float = 1.0
    kv_weight: float = 2.0

    def __post_init__(self) -> None:
        PrefixKeyParams.__post_init__(self)
        if self.load_bound < 1.0:
            raise ValueError("load_bound must be at least 1.0")
        if self.load_slack < 0:
            raise ValueError("load_slack must be >= 0")

    @property
    def weights(self) -> LoadWeights:
        return LoadWeights(self.waiting_weight, self.kv_weight)

    def capacity(self, values: Mapping[str, float]) -> float:
        """:func:`load_capacity` with this bound and slack."""
        return load_capacity(values, self.load_bound, self.load_slack)
