"""prefix_affinity and two_choice: determinism, bounded-load spill, join stability, key choice."""

from __future__ import annotations

import random

import pytest

from policy_support import BACKENDS, random_traffic
from prefixserving import constants
from prefixserving.router.policies.base import (
    BackendLoad,
    DecisionReason,
    RoutingContext,
    RoutingPolicy,
    route,
)
from prefixserving.router.policies.key_choice import PrefixKeyParams, PrefixKeySelector
from prefixserving.router.policies.prefix_affinity import (
    PrefixAffinityConfig,
    PrefixAffinityPolicy,
)
from prefixserving.router.policies.ranking import rendezvous_rank
from prefixserving.router.policies.registry import POLICY_NAMES, make_policy
from prefixserving.router.policies.two_choice import TwoChoicePolicy
from prefixserving.router.prefix_hashing import KeyConfig


def _ranking(policy: RoutingPolicy, blocks: tuple[int, ...]) -> tuple[str, ...]:
    """The policy's order of preference for ``blocks`` when every backend is idle."""
    return policy.select(RoutingContext(blocks, BACKENDS)).candidates


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_two_instances_agree(name: str) -> None:
    first, second = make_policy(name), make_policy(name)
    for ctx in random_traffic(1, 600):
        a, b = first.select(ctx), second.select(ctx)
        assert a == b
        first.on_routed(ctx, a)
        second.on_routed(ctx, b)


def test_shared_prefix_sticks_to_one_backend_when_idle() -> None:
    policy = PrefixAffinityPolicy()
    chosen = set()
    for i in range(400):
        # 10 requests of one conversation among 390 others: not hot, so it stays together.
        blocks = (42, 43, i) if i % 40 == 0 else (10_000 + i, 1)
        decision = route(policy, RoutingContext(blocks, BACKENDS))
        if blocks[0] == 42:
            chosen.add(decision)
    assert len(chosen) == 1
    assert next(iter(chosen)).reason is DecisionReason.AFFINITY


def test_distinct_prefixes_spread() -> None:
    policy = PrefixAffinityPolicy()
    counts: dict[str, int] = {}
    for first in range(800):
        backend = route(policy, RoutingContext((first * 7919 + 3, 1), BACKENDS)).backend
        counts[backend] = counts.get(backend, 0) + 1
    assert set(counts) == set(BACKENDS)
    assert max(counts.values()) < 2 * 800 / len(BACKENDS)


# The bounded-load mechanics, with one bound for every key (light_load_bound = load_bound):
# a new key's first request has weight 0, so it would get light_load_bound.
PLAIN_BOUND = {"load_slack": 0, "light_load_bound": constants.ROUTER_LOAD_BOUND}


def test_spills_in_ranking_order_when_first_choice_is_over_the_bound() -> None:
    policy = make_policy("prefix_affinity", **PLAIN_BOUND)
    blocks = (7, 8, 9)
    ranking = _ranking(policy, blocks)
    # Mean load 2: capacity = ceil(1.25 * 17 / 8) = 3; the first choice already has 3.
    loads = {b: BackendLoad(in_flight=2) for b in BACKENDS}
    loads[ranking[0]] = BackendLoad(in_flight=3)
    loads[ranking[1]] = BackendLoad(in_flight=1)
    decision = route(policy, RoutingContext(blocks, BACKENDS, loads))
    assert decision.backend == ranking[1]
    assert decision.reason is DecisionReason.SPILLED


def test_slack_keeps_affinity_for_small_absolute_gaps() -> None:
    policy = make_policy("prefix_affinity", load_slack=4)
    blocks = (7, 8, 9)
    ranking = _ranking(policy, blocks)
    loads = {b: BackendLoad(in_flight=1) for b in BACKENDS}
    loads[ranking[0]] = BackendLoad(in_flight=5)  # mean after = 13/8; 5 < 13/8 + 4
    assert route(policy, RoutingContext(blocks, BACKENDS, loads)).reason is DecisionReason.AFFINITY
    loads[ranking[0]] = BackendLoad(in_flight=6)
    assert route(policy, RoutingContext(blocks, BACKENDS, loads)).reason is DecisionReason.SPILLED


def test_keeps_affinity_within_the_bound() -> None:
    policy = PrefixAffinityPolicy()
    blocks = (7, 8, 9)
    ranking = _ranking(policy, blocks)
    loads = {b: BackendLoad(in_flight=2) for b in BACKENDS}
    loads[ranking[0]] = BackendLoad(in_flight=2, waiting=0, kv_usage=0.0)
    decision = route(policy, RoutingContext(blocks, BACKENDS, loads))
    assert decision[:2] == (ranking[0], DecisionReason.AFFINITY)


def test_fallback_to_least_loaded_after_spill_ranks() -> None:
    policy = make_policy("prefix-affinity", spill_ranks=2, **PLAIN_BOUND)
    blocks = (7, 8, 9)
    ranking = _ranking(policy, blocks)
    loads = {b: BackendLoad(in_flight=2) for b in BACKENDS}
    loads[ranking[0]] = BackendLoad(in_flight=4)
    loads[ranking[1]] = BackendLoad(in_flight=4)
    loads[ranking[5]] = BackendLoad(in_flight=0, kv_usage=0.2)
    decision = route(policy, RoutingContext(blocks, BACKENDS, loads))
    assert decision[:2] == (ranking[5], DecisionReason.FALLBACK)


def test_fallbacks_are_the_next_ranks_within_the_bound_then_the_least_loaded() -> None:
    policy = make_policy("prefix_affinity", **PLAIN_BOUND)
    blocks = (7, 8, 9)
    ranking = _ranking(policy, blocks)
    # Mean after this request 20/8: capacity ceil(1.25 * 20 / 8) = 4. Ranks 0 and 2 are over.
    loads = {b: BackendLoad(in_flight=2) for b in BACKENDS}
    loads[ranking[0]] = BackendLoad(in_flight=4)
    loads[ranking[2]] = BackendLoad(in_flight=5)
    loads[ranking[6]] = BackendLoad(in_flight=0)
    decision = policy.select(RoutingContext(blocks, BACKENDS, loads))
    assert decision[:2] == (ranking[1], DecisionReason.SPILLED)
    # No other rank within spill_ranks is within the bound: the rest by load, ties by rank.
    rest = [b for b in ranking if b not in (ranking[1], ranking[6], ranking[0], ranking[2])]
    assert decision.fallbacks == (ranking[6], *rest, ranking[0], ranking[2])


def test_a_read_before_the_count_sees_the_counts_the_count_leaves() -> None:
    """``select`` reads the key as it will be once the request is counted (``on_routed``):
    the shares it uses are exactly, bit for bit, those the count leaves, through slot
    collisions, a block repeated in one request and the sketch's rescaling."""
    params = PrefixKeyParams(window_requests=2, sketch_width=64, min_requests=1)  # rescales
    selector = PrefixKeySelector(params)
    rng = random.Random(4)
    for _ in range(600):
        blocks = tuple(rng.randrange(40) for _ in range(rng.randrange(1, 6)))
        n = rng.randrange(1, 9)
        depth, choice = selector.depth(blocks, n), selector.choose(blocks, n)
        selector.observe(blocks)
        shares = [selector.share(block) for block in blocks]
        hot = [share > selector.threshold(n) for share in shares]
        assert depth == (hot.index(False) if False in hot else len(blocks) - 1)
        assert choice is not None and choice.key == blocks[depth]
        if choice.parent is None:  # the key's share less the request's own count
            assert 0.0 <= choice.weight < shares[depth]


def test_fractional_loads_keep_affinity_at_low_load() -> None:
    policy = PrefixAffinityPolicy()
    loads = {b: BackendLoad(kv_usage=0.01 * i) for i, b in enumerate(BACKENDS)}
    decision = route(policy, RoutingContext((1, 2), BACKENDS, loads))
    assert decision.reason is DecisionReason.AFFINITY


def test_request_without_blocks_goes_to_least_loaded() -> None:
    loads = {b: BackendLoad(in_flight=3) for b in BACKENDS}
    loads[BACKENDS[5]] = BackendLoad(in_flight=0)
    for name in ("prefix_affinity", "two_choice"):
        decision = route(make_policy(name), RoutingContext((), BACKENDS, loads))
        assert decision[:2] == (BACKENDS[5], DecisionReason.BALANCE)


def test_a_join_moves_about_one_in_n_keys_all_to_the_newcomer() -> None:
    keys = [random.Random(k).getrandbits(64) for k in range(4000)]
    before = {k: rendezvous_rank(k, BACKENDS)[0] for k in keys}
    grown = (*BACKENDS, "10.0.0.99:8000")
    after = {k: rendezvous_rank(k, grown)[0] for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert all(after[k] == "10.0.0.99:8000" for k in moved)
    assert abs(len(moved) / len(keys) - 1 / len(grown)) < 0.03


def test_a_leave_moves_only_the_keys_of_the_leaver() -> None:
    keys = [random.Random(k).getrandbits(64) for k in range(2000)]
    shrunk = BACKENDS[1:]
    for k in keys:
        before = rendezvous_rank(k, BACKENDS)
        if before[0] != BACKENDS[0]:
            assert rendezvous_rank(k, shrunk)[0] == before[0]


def test_hot_first_block_is_split_by_the_next_block() -> None:
    """Every request shares a system-prompt block; each document behind it sticks to one
    backend and the documents spread over all of them."""
    policy = PrefixAffinityPolicy()
    rng = random.Random(3)
    owners: dict[int, set[str]] = {}
    for i in range(2000):
        doc = rng.randrange(64)
        backend = route(policy, RoutingContext((77, 10_000 + doc, 20_000 + i), BACKENDS)).backend
        if i >= 200:
            owners.setdefault(doc, set()).add(backend)
    assert all(len(backends) == 1 for backends in owners.values())
    assert len(set().union(*owners.values())) == len(BACKENDS)


def test_routers_fed_different_halves_agree_on_prefixes_away_from_the_threshold() -> None:
    """Two routers behind a Service see different halves of the traffic; their rankings
    still agree for every prefix whose share is far from the hot threshold."""
    first, second = PrefixAffinityPolicy(), PrefixAffinityPolicy()
    rng = random.Random(11)
    for i in range(3000):
        doc = rng.randrange(100)  # 1% each: far below 0.5 / 8
        ctx = RoutingContext((5, 6, 1000 + doc, 50_000 + i), BACKENDS)  # 5, 6: everyone's
        route(first if rng.random() < 0.5 else second, ctx)
    for doc in range(100):
        blocks = (5, 6, 1000 + doc, 1)
        assert _ranking(first, blocks) == _ranking(second, blocks)
        assert first.selector.depth(blocks, len(BACKENDS)) == 2


def test_router_replicas_weigh_keys_alike_whatever_share_of_the_traffic_they_see() -> None:
    """One router sees all requests, another every 8th (8 replicas behind a Service). A
    key's weight, which sets its load bound, is its share of the requests counted before
    it, so both give a new conversation weight 0 and a steady key about its share; counting
    the request itself would weigh a new key 1/T on one and 8/T on the other."""
    everything = PrefixKeySelector(PrefixKeyParams())
    eighth = PrefixKeySelector(PrefixKeyParams())
    for i in range(8000):
        blocks = (77, 78) if i % 25 == 0 else (10_000 + i, 1)  # key 77 carries 4%
        everything.observe(blocks)
        if i % 8 == 0:
            eighth.observe(blocks)
    for selector in (everything, eighth):
        new = selector.choose((999_999, 1), 8)
        steady = selector.choose((77, 78), 8)
        assert new is not None and new.weight == 0.0
        assert steady is not None and steady.weight == pytest.approx(0.04, rel=0.1)


def test_a_prefix_every_request_shares_needs_every_backend_from_the_start() -> None:
    """A system prompt in every request is spread over all backends (no ``parent``) from
    the first requests on: whether a prefix needs every backend is judged by its share of
    the requests counted, not by the share the ``min_requests`` floor damps (which made it
    look like it needed 2 backends after 5 requests, and every router replica funnel its
    first requests through them)."""
    selector = PrefixKeySelector(PrefixKeyParams())
    for doc in range(40):
        choice = selector.choose((5, 1000 + doc, 50_000 + doc), 8)
        assert choice is not None
        if choice.key != 5:  # 5 is hot (above 1/16 of the floored share) from its 5th request
            assert choice.parent is None and choice.homes == 8
        selector.observe((5, 1000 + doc, 50_000 + doc))
    assert selector.choose((5, 2000, 1), 8).key == 2000


def test_key_depth_follows_popularity() -> None:
    selector = PrefixKeySelector(PrefixKeyParams())
    for i in range(1000):
        selector.observe((1, 2, 100 + i % 50))
    # Blocks 1 and 2 are in every request: hot for 8 backends. Block 100 + j carries 2%.
    assert selector.depth((1, 2, 105), 8) == 2
    # A never-seen first block is cold: key at depth 0.
    assert selector.depth((9, 2, 105), 8) == 0
    # With one backend nothing is hot (share <= 0.5 / 1 fails only above 50%).
    assert selector.depth((1, 2, 105), 1) == 2
    assert selector.depth((3, 4), 1) == 0


def test_popularity_decays() -> None:
    selector = PrefixKeySelector(PrefixKeyParams(window_requests=100))
    for _ in range(500):
        selector.observe((1,))
    hot = selector.share(1)
    for i in range(1000):
        selector.observe((1000 + i,))
    assert hot > 0.9
    assert selector.share(1) < 0.01


def test_two_choice_uses_only_its_two_candidates() -> None:
    policy = make_policy("two_choice", hot_share=1e9)  # one prefix only: never split it
    rng = random.Random(5)
    blocks = (31, 32)
    pair = TwoChoicePolicy.candidates(31, BACKENDS)
    assert len(set(pair)) == 2
    for _ in range(200):
        loads = {b: BackendLoad(in_flight=rng.randrange(10)) for b in BACKENDS}
        assert route(policy, RoutingContext(blocks, BACKENDS, loads)).backend in pair


def test_two_choice_keeps_affinity_then_spills_to_the_other_candidate() -> None:
    policy = make_policy("two_choice", load_slack=0)
    blocks = (31, 32)
    first = route(policy, RoutingContext(blocks, BACKENDS))
    assert first.reason is DecisionReason.BALANCE
    again = route(policy, RoutingContext(blocks, BACKENDS))
    assert again[:2] == (first.backend, DecisionReason.AFFINITY)
    other = next(b for b in TwoChoicePolicy.candidates(31, BACKENDS) if b != first.backend)
    loads = {b: BackendLoad(in_flight=1) for b in BACKENDS}
    loads[first.backend] = BackendLoad(in_flight=6)
    spilled = route(policy, RoutingContext(blocks, BACKENDS, loads))
    assert spilled[:2] == (other, DecisionReason.SPILLED)


def test_a_heavy_key_spills_where_a_light_key_stays() -> None:
    """One key carries 4% of the traffic (heavy: over 1/8 of a backend's fair share of 12.5%,
    yet not hot), the rest are one-off conversations. At the same moderately high load on
    their home, the heavy key moves and the light one keeps its cache."""
    policy = make_policy("prefix_affinity", load_slack=0)
    for i in range(900):
        blocks = (77, 78) if i % 25 == 0 else (10_000 + i, 1)
        route(policy, RoutingContext(blocks, BACKENDS))

    def decide(blocks: tuple[int, ...]) -> DecisionReason:
        home = _ranking(policy, blocks)[0]
        loads = {b: BackendLoad(in_flight=4) for b in BACKENDS}
        loads[home] = BackendLoad(in_flight=8)  # mean after 37/8: heavy cap 6, light cap 9
        return route(policy, RoutingContext(blocks, BACKENDS, loads)).reason

    assert decide((77, 78)) is DecisionReason.SPILLED
    assert decide((555_555, 1)) is DecisionReason.AFFINITY


def test_one_bound_for_all_keys_when_light_equals_heavy() -> None:
    config = PrefixAffinityConfig(light_load_bound=1.25)
    assert config.bound_for(0.0, 8) == config.bound_for(1.0, 8) == 1.25
    graded = PrefixAffinityConfig()
    assert graded.bound_for(0.0, 8) == graded.light_load_bound
    assert graded.bound_for(graded.heavy_share / 8, 8) == graded.load_bound
    assert graded.load_bound < graded.bound_for(graded.heavy_share / 16, 8) < 2.0
    # A --load-bound above the light bound (the CLI sets only load_bound) is one bound.
    loose = PrefixAffinityConfig(load_bound=3.0)
    assert loose.bound_for(0.0, 8) == loose.bound_for(1.0, 8) == 3.0
    with pytest.raises(ValueError, match="light_load_bound"):
        PrefixAffinityConfig(light_load_bound=0.5)


def test_a_hot_document_lives_on_as_many_backends_as_it_needs() -> None:
    """Behind a system prompt everyone shares, one document takes 20% of the traffic: hot for
    8 backends (over 0.5 / 8), so its questions are spread, but over ceil(0.2 / 0.0625) = 4
    backends, the document's first rendezvous choices (its home while it was not hot comes
    first), not over all 8."""
    policy = PrefixAffinityPolicy()
    rng = random.Random(7)
    used: set[str] = set()
    for i in range(3000):
        if i % 5 == 0:
            blocks = (5, 6, 900, 901, 50_000 + i)
        else:
            doc = 1000 + rng.randrange(100)
            blocks = (5, 6, doc, doc + 1, 50_000 + i)
        backend = route(policy, RoutingContext(blocks, BACKENDS)).backend
        if i % 5 == 0 and i >= 1000:
            used.add(backend)
    assert used == set(rendezvous_rank(900, BACKENDS)[:4])


def test_routers_with_different_in_flight_counts_agree_on_engine_counts() -> None:
    """Each router counts only its own in-flight requests; the engines' running and waiting
    counts, scraped by both, include every router's. Same scraped loads, same choices."""
    first, second = make_policy("prefix_affinity"), make_policy("prefix_affinity")
    rng = random.Random(2)
    choices = []
    for i in range(600):
        blocks = (1000 + rng.randrange(40), 5000 + i)
        running = {b: float(rng.randrange(4, 24)) for b in BACKENDS}
        mine = {b: rng.randrange(int(running[b]) + 1) for b in BACKENDS}
        loads_a = {b: BackendLoad(mine[b], 1.0, 0.3, running[b]) for b in BACKENDS}
        loads_b = {
            b: BackendLoad(int(running[b]) - mine[b], 1.0, 0.3, running[b]) for b in BACKENDS
        }
        a = route(first, RoutingContext(blocks, BACKENDS, loads_a))
        b = route(second, RoutingContext(blocks, BACKENDS, loads_b))
        assert a == b, i
        choices.append(a.reason)
    assert DecisionReason.SPILLED in choices  # the loads did push some requests off home


def test_the_key_depth_covers_every_block_the_router_hashes() -> None:
    assert PrefixKeyParams().max_depth_blocks == KeyConfig().prefix_blocks
    assert KeyConfig().prefix_blocks == constants.ROUTER_PREFIX_BLOCKS
