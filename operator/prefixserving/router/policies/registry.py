"""Policy names to policies: ``make_policy("prefix-affinity", load_bound=1.5)``.

A name is the policy's module name, its ``name`` attribute and its metric label, all the
same snake_case string; the CLI spelling with dashes (``prefix-affinity``) maps to it.
Keyword arguments are the fields of the policy's ``<Name>Config``; an unknown one is an error
that lists the accepted fields.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from prefixserving.api import defaults
from prefixserving.router.policies.base import RoutingPolicy
from prefixserving.router.policies.least_loaded import LeastLoadedConfig, LeastLoadedPolicy
from prefixserving.router.policies.prefix_affinity import (
    PrefixAffinityConfig,
    PrefixAffinityPolicy,
)
from prefixserving.router.policies.round_robin import RoundRobinConfig, RoundRobinPolicy
from prefixserving.router.policies.two_choice import TwoChoiceConfig, TwoChoicePolicy

# The API default (spec.router.algorithm), in the registry's spelling.
DEFAULT_POLICY = defaults.ROUTER_ALGORITHM.replace("-", "_")

_REGISTRY: dict[str, tuple[type[Any], type[Any]]] = {
    PrefixAffinityPolicy.name: (PrefixAffinityPolicy, PrefixAffinityConfig),
    TwoChoicePolicy.name: (TwoChoicePolicy, TwoChoiceConfig),
    RoundRobinPolicy.name: (RoundRobinPolicy, RoundRobinConfig),
    LeastLoadedPolicy.name: (LeastLoadedPolicy, LeastLoadedConfig),
}

POLICY_NAMES: tuple[str, ...] = tuple(_REGISTRY)


def canonical_name(name: str) -> str:
    """``prefix-affinity`` -> ``prefix_affinity``; raises ``ValueError`` for unknown names."""
    key = name.strip().lower().replace("-", "_")
    if key not in _REGISTRY:
        known = ", ".join(n.replace("_", "-") for n in POLICY_NAMES)
        raise ValueError(f"unknown routing policy {name!r}; choose one of: {known}")
    return key


def make_policy(name: str, **config: Any) -> RoutingPolicy:
    """A fresh policy ``name`` with its config built from ``config`` (defaults elsewhere)."""
    key = canonical_name(name)
    policy_cls, config_cls = _REGISTRY[key]
    fields = {f.name for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(config) - fields)
    if unknown:
        accepted = ", ".join(sorted(fields)) or "none"
        raise ValueError(
            f"unknown parameter(s) {', '.join(unknown)} for routing policy {key!r}; "
            f"accepted: {accepted}"
        )
    policy: RoutingPolicy = policy_cls(config_cls(**config))
    return policy
