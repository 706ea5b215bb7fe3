"""Routing identities: a backend that inherits another's identity takes exactly its place."""

from __future__ import annotations

import random

import pytest

from policy_support import BACKENDS, random_traffic
from prefixserving.router.policies.base import RoutingContext, home_after_join
from prefixserving.router.policies.ranking import rendezvous_rank
from prefixserving.router.policies.registry import make_policy

OLD, NEW = BACKENDS[2], "10.0.0.99:8000"
REPLACED = tuple(sorted([*(b for b in BACKENDS if b != OLD), NEW]))
KEYS = [random.Random(k).getrandbits(64) for k in range(3000)]


def _swap(backend: str) -> str:
    return NEW if backend == OLD else backend


def test_an_inherited_identity_takes_the_replaced_backends_place_in_every_ranking() -> None:
    inherited = {NEW: OLD}
    for key in KEYS:
        before = rendezvous_rank(key, BACKENDS)
        assert rendezvous_rank(key, REPLACED, identities=inherited) == [_swap(b) for b in before]


def test_without_identities_a_replacement_moves_about_two_in_n_first_choices() -> None:
    """What the identity saves: the replaced backend's keys spread over the others and the
    newcomer takes a share of everyone's: (N-1)/N of the old backend's 1/N, plus 1/N of the
    others' (N-1)/N, 2(N-1)/N^2 in all."""
    moved = sum(
        _swap(rendezvous_rank(k, BACKENDS)[0]) != rendezvous_rank(k, REPLACED)[0] for k in KEYS
    )
    n = len(BACKENDS)
    assert abs(moved / len(KEYS) - 2 * (n - 1) / n**2) < 0.03


def test_two_backends_with_one_identity_sit_side_by_side_ordered_by_id() -> None:
    both = (*BACKENDS, NEW)  # the old and the new pod, both Ready for a moment
    for key in KEYS[:500]:
        ranking = rendezvous_rank(key, both, identities={NEW: OLD})
        at = ranking.index(OLD)
        assert ranking[at + 1] == NEW  # OLD sorts before NEW ("10.0.0.2" < "10.0.0.99")
        assert [b for b in ranking if b != NEW] == rendezvous_rank(key, BACKENDS)


@pytest.mark.parametrize("name", ["prefix_affinity", "two_choice"])
def test_policies_route_by_identity(name: str) -> None:
    """Same traffic before and after a replacement that inherits the identity: every
    decision is the same, with the new backend where the old one was."""
    before, after = make_policy(name), make_policy(name)
    for ctx in random_traffic(7, 400):
        old = before.select(ctx)
        moved = RoutingContext(
            ctx.blocks, REPLACED, {_swap(b): v for b, v in ctx.loads.items()}, {}, {NEW: OLD}
        )
        new = after.select(moved)
        assert new.candidates == tuple(_swap(b) for b in old.candidates)
        before.on_routed(ctx, old)
        after.on_routed(moved, new)


def test_the_hot_prefix_answer_follows_the_inherited_identity() -> None:
    """home_after_join: a member replacing a backend whose identity the router knows owns
    exactly that backend's keys; a router that knows no identities spreads them."""
    policy = make_policy("prefix_affinity")
    keys = [(k, k + 1) for k in KEYS[:800]]
    known = {b: f"pod-{i}" for i, b in enumerate(BACKENDS)}
    owned = {k for k in keys if home_after_join(policy, k, BACKENDS, NEW, OLD, None, known) == NEW}
    held = {
        k
        for k in keys
        if policy.select(RoutingContext(k, BACKENDS, identities=known)).backend == OLD
    }
    assert owned == held
    plain = {k for k in keys if home_after_join(policy, k, BACKENDS, NEW, OLD) == NEW}
    assert plain != held
