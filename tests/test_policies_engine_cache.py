"""prefix_affinity with the engines' KV cache events (``RoutingContext.cached``): follows the
engine that leads, keeps the ranking without events, on ties and after a restart, and keeps
the load bound."""

from __future__ import annotations

import random

import pytest

from policy_support import BACKENDS, random_traffic
from prefixserving.router.policies.base import BackendLoad, DecisionReason, RoutingContext
from prefixserving.router.policies.prefix_affinity import (
    PrefixAffinityConfig,
    PrefixAffinityPolicy,
)
from prefixserving.router.policies.registry import make_policy

BLOCKS = (11, 22, 33)


def _ranking(blocks: tuple[int, ...] = BLOCKS) -> tuple[str, ...]:
    """A fresh policy's order of preference for ``blocks`` with every backend idle."""
    return PrefixAffinityPolicy().select(RoutingContext(blocks, BACKENDS)).candidates


def _cached(**depths: int) -> dict[str, int]:
    """Every backend listed (0: holds none), as a router following the events gives it;
    ``depths`` by rank: ``r0=3`` is the ranking's first backend holding 3 blocks."""
    ranking = _ranking()
    out = dict.fromkeys(BACKENDS, 0)
    for rank, depth in depths.items():
        out[ranking[int(rank[1:])]] = depth
    return out


def test_without_events_the_decision_ignores_what_events_would_change() -> None:
    ranking = _ranking()
    # The second rank is much less loaded and a lower rank holds the whole prefix: both
    # would move the request with events, and neither may without them.
    loads = {ranking[0]: BackendLoad(running=3), ranking[5]: BackendLoad(running=2)}
    plain = PrefixAffinityPolicy().select(RoutingContext(BLOCKS, BACKENDS, loads))
    assert plain.backend == ranking[0] and plain.reason is DecisionReason.AFFINITY
    followed = PrefixAffinityPolicy().select(RoutingContext(BLOCKS, BACKENDS, loads, _cached(r5=3)))
    assert followed.backend == ranking[5] and followed.reason is DecisionReason.CACHED
    balanced = PrefixAffinityPolicy().select(RoutingContext(BLOCKS, BACKENDS, loads, _cached()))
    assert balanced.backend == ranking[1] and balanced.reason is DecisionReason.BALANCE


def test_a_spilled_conversation_follows_its_latest_turn() -> None:
    ranking = _ranking()
    # Turn t went home (rank 0, 2 blocks); turn t + 1 spilled to rank 2 (3 blocks).
    decision = PrefixAffinityPolicy().select(
        RoutingContext(BLOCKS, BACKENDS, cached=_cached(r0=2, r2=3))
    )
    assert decision.backend == ranking[2] and decision.reason is DecisionReason.CACHED
    assert decision.fallbacks[0] == ranking[0]  # step 4's order follows, the leader removed
    assert sorted(decision.candidates) == sorted(BACKENDS)


def test_a_prefix_every_engine_holds_still_spreads_by_the_ranking() -> None:
    for tail in range(40):
        blocks = (7, tail)
        ranking = _ranking(blocks)
        everywhere = {b: 1 for b in BACKENDS}  # the shared first block, on every engine
        everywhere[ranking[0]] = 0  # even a new engine that holds none of it keeps its keys
        decision = PrefixAffinityPolicy().select(
            RoutingContext(blocks, BACKENDS, cached=everywhere)
        )
        assert decision.backend == ranking[0]
        assert decision.reason is DecisionReason.AFFINITY


def test_a_lead_below_the_margin_keeps_the_ranking() -> None:
    ranking = _ranking()
    cached = _cached(r3=5, r4=4)
    assert (
        PrefixAffinityPolicy().select(RoutingContext(BLOCKS, BACKENDS, cached=cached)).backend
        == (ranking[3])
    )
    strict = PrefixAffinityPolicy(PrefixAffinityConfig(cache_lead_blocks=2))
    assert strict.select(RoutingContext(BLOCKS, BACKENDS, cached=cached)).backend == ranking[0]


def test_the_load_bound_still_applies_to_the_engine_holding_the_prefix() -> None:
    ranking = _ranking()
    # The holder is far over the bound: the request spills as it would without events.
    loads = {ranking[4]: BackendLoad(running=40)}
    cached = _cached(r4=3)
    without = PrefixAffinityPolicy().select(RoutingContext(BLOCKS, BACKENDS, loads))
    decision = PrefixAffinityPolicy().select(RoutingContext(BLOCKS, BACKENDS, loads, cached))
    assert decision == without
    assert decision.backend == ranking[0]
    # The first choice over the bound too: the next rank, by the ranking (the rest hold 0).
    loads[ranking[0]] = BackendLoad(running=40)
    spilled = PrefixAffinityPolicy().select(RoutingContext(BLOCKS, BACKENDS, loads, cached))
    assert spilled.backend == ranking[1] and spilled.reason is DecisionReason.SPILLED
    # A holder below the bound among saturated ones is followed.
    loads[ranking[4]] = BackendLoad()
    assert (
        PrefixAffinityPolicy().select(RoutingContext(BLOCKS, BACKENDS, loads, cached)).backend
        == (ranking[4])
    )


def test_two_choices_by_load_need_more_than_the_gap() -> None:
    ranking = _ranking()
    for running, chosen in ((1.0, ranking[0]), (2.0, ranking[1])):
        loads = {ranking[0]: BackendLoad(running=running)}
        decision = PrefixAffinityPolicy().select(RoutingContext(BLOCKS, BACKENDS, loads, _cached()))
        assert decision.backend == chosen  # balance_gap 1: one request more is not enough


def test_two_choices_by_load_never_move_off_a_shared_prefix() -> None:
    ranking = _ranking()
    loads = {ranking[0]: BackendLoad(running=3)}
    # Ranks 0 and 3 hold a shared document (a tie: nobody leads); rank 1 does not.
    decision = PrefixAffinityPolicy().select(
        RoutingContext(BLOCKS, BACKENDS, loads, _cached(r0=2, r3=2))
    )
    assert decision.backend == ranking[0] and decision.reason is DecisionReason.AFFINITY
    both = PrefixAffinityPolicy().select(
        RoutingContext(BLOCKS, BACKENDS, loads, _cached(r0=2, r1=2))
    )
    assert both.backend == ranking[1] and both.reason is DecisionReason.BALANCE


def test_a_restarted_router_follows_the_events_from_its_first_request() -> None:
    ranking = _ranking()
    seasoned = PrefixAffinityPolicy()
    for ctx in random_traffic(3, 500, cached=True):
        seasoned.on_routed(ctx, seasoned.select(ctx))
    fresh = PrefixAffinityPolicy()
    held = RoutingContext(BLOCKS, BACKENDS, cached=_cached(r6=3))
    assert fresh.select(held).backend == seasoned.select(held).backend == ranking[6]
    # Before its subscriber has caught up (nothing known yet), it routes by the ranking.
    assert fresh.select(RoutingContext(BLOCKS, BACKENDS)).backend == ranking[0]


def test_two_replicas_with_the_same_events_and_loads_agree() -> None:
    first, second = make_policy("prefix-affinity"), make_policy("prefix-affinity")
    for ctx in random_traffic(1, 600, cached=True):
        a, b = first.select(ctx), second.select(ctx)
        assert a == b
        first.on_routed(ctx, a)
        second.on_routed(ctx, b)


def test_routers_fed_different_halves_agree_where_one_engine_leads() -> None:
    traffic = random_traffic(2, 1200, cached=True)
    left, right = PrefixAffinityPolicy(), PrefixAffinityPolicy()
    for i, ctx in enumerate(traffic):
        policy = left if i % 2 else right
        policy.on_routed(ctx, policy.select(ctx))
    rng = random.Random(5)
    for group in range(40):
        blocks = (1000 + group, 5000 + group * 7, rng.getrandbits(64))
        holder = rng.choice(BACKENDS)
        cached = {b: (3 if b == holder else 1) for b in BACKENDS}
        ctx = RoutingContext(blocks, BACKENDS, cached=cached)
        assert left.select(ctx).backend == right.select(ctx).backend == holder


@pytest.mark.parametrize(("field", "value"), [("cache_lead_blocks", 0), ("balance_gap", -1.0)])
def test_config_rejects_bad_engine_event_parameters(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        PrefixAffinityConfig(**{field: value})
