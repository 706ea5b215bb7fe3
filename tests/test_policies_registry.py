"""Registry, round-robin and least-loaded."""

from __future__ import annotations

import random

import pytest

from prefixserving.router.policies import least_loaded, prefix_affinity, round_robin, two_choice
from prefixserving.router.policies.base import BackendLoad, DecisionReason, RoutingContext, route
from prefixserving.router.policies.registry import POLICY_NAMES, canonical_name, make_policy

BACKENDS = ("a:1", "b:1", "c:1")


def test_names_match_modules_and_registry_keys() -> None:
    modules = {
        "prefix_affinity": prefix_affinity.PrefixAffinityPolicy,
        "two_choice": two_choice.TwoChoicePolicy,
        "round_robin": round_robin.RoundRobinPolicy,
        "least_loaded": least_loaded.LeastLoadedPolicy,
    }
    assert set(POLICY_NAMES) == set(modules)
    for name, cls in modules.items():
        policy = make_policy(name)
        assert isinstance(policy, cls)
        assert policy.name == name


def test_cli_spelling_maps_to_the_registry_key() -> None:
    assert canonical_name("prefix-affinity") == "prefix_affinity"
    assert make_policy("Two-Choice").name == "two_choice"


def test_unknown_name_lists_the_choices() -> None:
    with pytest.raises(ValueError, match="prefix-affinity"):
        make_policy("random")


def test_config_keywords_reach_the_policy() -> None:
    policy = make_policy("prefix-affinity", load_bound=1.5, hot_share=0.25)
    assert policy.config.load_bound == 1.5  # type: ignore[attr-defined]
    assert policy.config.hot_share == 0.25  # type: ignore[attr-defined]


def test_unknown_or_invalid_parameter_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"accepted: .*load_bound"):
        make_policy("prefix_affinity", bound=2)
    with pytest.raises(ValueError, match="load_bound"):
        make_policy("prefix_affinity", load_bound=0.5)
    with pytest.raises(ValueError, match="accepted: none"):
        make_policy("round-robin", x=1)


def test_round_robin_cycles_over_the_current_backends() -> None:
    policy = make_policy("round-robin")
    picks = [route(policy, RoutingContext((1,), BACKENDS)).backend for _ in range(6)]
    assert picks == list(BACKENDS) * 2


def test_least_loaded_uses_all_three_signals() -> None:
    policy = make_policy("least-loaded")
    loads = {
        "a:1": BackendLoad(in_flight=1),
        "b:1": BackendLoad(in_flight=0, waiting=2),
        "c:1": BackendLoad(in_flight=0, kv_usage=0.9),
    }
    decision = route(policy, RoutingContext((1,), BACKENDS, loads))
    assert decision[:2] == ("a:1", DecisionReason.BALANCE)
    loads["a:1"] = BackendLoad(in_flight=2)
    assert route(policy, RoutingContext((1,), BACKENDS, loads)).backend == "c:1"


def test_least_loaded_rotates_among_equals() -> None:
    policy = make_policy("least-loaded")
    picks = {route(policy, RoutingContext((), BACKENDS)).backend for _ in range(3)}
    assert picks == set(BACKENDS)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_no_backends_is_an_error(name: str) -> None:
    with pytest.raises(ValueError, match="no backends"):
        make_policy(name).select(RoutingContext((1,), ()))


def _traffic(seed: int, count: int) -> list[RoutingContext]:
    """Requests of 20 prefixes over the four backends, with small random loads (so that
    backends often tie and a rotation decides)."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        loads = {b: BackendLoad(in_flight=rng.randrange(3)) for b in BACKENDS}
        out.append(RoutingContext((rng.randrange(20), rng.randrange(3)), BACKENDS, loads))
    return out


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_select_changes_no_state(name: str) -> None:
    """Two copies route the same requests; one is also asked about other requests in between
    (as the hot-prefix endpoint asks): their decisions stay the same."""
    routed, asked = make_policy(name), make_policy(name)
    questions = _traffic(2, 300)
    for ctx, question in zip(_traffic(1, 300), questions, strict=True):
        asked.select(question)
        assert asked.select(question) == asked.select(question)
        assert route(asked, ctx) == route(routed, ctx)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_fallbacks_are_other_healthy_backends_without_repeats(name: str) -> None:
    policy = make_policy(name)
    for ctx in _traffic(3, 200):
        candidates = route(policy, ctx).candidates
        assert len(set(candidates)) == len(candidates) and set(candidates) <= set(BACKENDS)
        if name == "two_choice":  # only its two candidates, as in DualMap
            assert len(candidates) == 2
        else:
            assert sorted(candidates) == sorted(BACKENDS)
