"""``prefix_affinity`` (CLI ``prefix-affinity``): rendezvous ranking by prefix, bounded load
that spills heavy prefixes first.

**Algorithm**

1. Key (:mod:`.key_choice`): take the shallowest of the request's leading block hashes that
   is not hot; requests behind the same not-hot prefix share a key, and a hot
   prefix such as a system prompt is split by what follows it. A hot prefix that needs fewer
   than N backends keeps ``homes`` of them: its rendezvous first choices.
2. Rank (:func:`affinity_ranking`): rendezvous hashing of the key over all backends; for a
   spread hot prefix, over its ``homes`` first (the key picks one of them, and spills stay
   among them, where the hot prefix is cached), then the rest of the hot prefix's ranking.
3. Per-request bound: a key that brings ``weight`` of the recent traffic to its backend gets
   ``bound = light_load_bound - (light_load_bound - load_bound) * min(1, weight * N /
   heavy_share)``: ``load_bound`` for a heavy key (at least ``heavy_share`` of one
   backend's fair share, 1/8 by default), up to ``light_load_bound`` for a key that is one
   conversation among thousands.
4. Walk the first ``spill_ranks`` backends of the ranking and take the first whose load is
   below ``max(ceil(bound * m), m + load_slack)``, ``m = (total + 1) / N`` the mean after this
   request (:mod:`.load`): the first is ``affinity``, a later one ``spilled``.
5. None of them: the least-loaded backend, ``fallback``. A request without blocks: the
   least-loaded backend, ``balance``.
6. Fallbacks (where a retry goes): the other backends of step 4 within the bound, in ranking
   order, then every other backend by load (least loaded first, ties in ranking order).
7. Engine events (only when ``ctx.cached`` is non-empty, i.e. the router follows the engines'
   KV cache events and lists each engine it follows, 0 for one holding none of the request):
   a. Among all backends within the key's bound, take the one holding the deepest cached
      prefix of the request (ties in ranking order). If its depth leads every other backend
      within the bound by at least ``cache_lead_blocks`` engine blocks, it goes first
      (``cached`` when step 4 chose another one).
   b. Otherwise no engine holds more of the request than the others (a new conversation, a
      new question on a shared document): when the first two backends of the ranking are
      within the bound, the second holds at least as much of the request as the first (so
      the move costs no hit) and its load is below the first one's by more than
      ``balance_gap``, the second goes first (``balance``): two choices by load, as
      two-choice places a new key, with the engines' events as the memory of where it went.
   The backend moved first is removed from its place in step 6's order.
8. Once routed (``on_routed``): count the request's blocks (:mod:`.key_choice`). Step 1 reads
   the counts as they will be with this request counted, so steps 1-7 change no state.

**Why a lead over every other backend, not over the first choice.** The depth that several
backends share says nothing about where this request belongs: a system prompt cached on every
engine, or a popular document on its ``homes``, is there by design, and the rendezvous ranking
of the key below it keeps spreading those requests (and warms a new engine, whose depth 0
never outranks a shared depth). Only a prefix one engine holds beyond the others marks the
request's own history: a conversation's earlier turns, wherever they were served, including
an engine its previous turn spilled to, so the next turn follows it there. That is also what
makes step 7b safe: without events a conversation placed by load would miss on its next turn
(which goes back to the ranking); with them the next turn finds it. Measured on the cluster
simulation (``bench/results/cluster-routers.md``, Mooncake trace, N = 8 and 16): with 7b, one
router reaches 99.2-99.9% of the best peer's hit rate and 8 routers keep 99.6% of one
router's; step 7a alone (``balance_gap`` 1e9) left one router at 64.1% and 63.4% against the
best peer's 65.1%, because the rendezvous placement of new conversations is what loads the
engines unevenly.

**Router replicas and restarts.** With ``cached`` empty step 7 is skipped and every decision
is exactly the one without events. Every router replica receives the same events, so
replicas that agree on the loads (the engines' own counts, scraped alike) agree on step 7,
as on the bound. While one replica has seen fewer events (after a restart, until its replay
catches up; the subscriber's few milliseconds of lag), its ``cached`` is missing or
shallower for some engines: it routes those requests by the ranking, or to an engine that
does hold what it reports, never outside the bound.

**Why heavy keys spill first.** A spilled request recomputes its whole prefix on a backend
that does not hold it. A heavy key (a popular document) is a lasting part of its home's load:
moving it relieves an imbalance that would otherwise last, and it moves to the same next
choice every time, which warms for it after one miss. A light key (one conversation) adds
load only while its burst lasts; spilling it pays a full prefix for a transient gain, and its
next turn goes home again and misses there too. Measured on the cluster simulation (Mooncake
trace, shared-prefix groups, N = 4, 8, 16): one bound for every key moved 6-18% of the
requests and kept 90-98% of the ideal hit rate; the graded bound moves 1-3% on the Mooncake
trace and keeps 97-99.6%, at max/mean requests of 1.08-1.25 as before, at the price of longer
queues in bursts of light conversations (TTFT p99), which ``light_load_bound`` trades back.

Load = max(in-flight, engine running + ``waiting_weight`` x waiting) + ``kv_weight`` x KV
usage (:mod:`.load`). Two router replicas with the same backends, loads and traffic make the
same choices: the ranking is a pure function and the key state evolves identically from the
same requests.

**Parameters** (:class:`PrefixAffinityConfig`)

- ``load_bound`` (1.25): largest load relative to the mean a backend may reach for a heavy key.
- ``light_load_bound`` (2.0): the same for a key with no recent traffic; at or below
  ``load_bound`` (``--load-bound 2.5`` for instance) every key gets ``load_bound``, which is
  plain bounded-load hashing.
- ``heavy_share`` (0.125): share of one backend's fair share of traffic (1 / N) from which a
  key gets ``load_bound``.
- ``load_slack`` (4.0): a backend within this much load of the mean is never over the bound.
  A relative bound on small counts spills on noise (with 4 backends and one request in
  flight, ``ceil(1.25 * 2 / 4) = 1`` would already push the next request of the same prefix
  elsewhere), and a spill recomputes the whole prefix; SGLang's router likewise requires an
  absolute gap (32) as well as a relative one before it rebalances.
- ``spill_ranks`` (3): backends of the ranking tried before falling back to the least loaded.
- ``cache_lead_blocks`` (1): engine blocks by which the deepest cached backend must lead every
  other backend within the bound to take the request from the ranking (step 7a).
- ``balance_gap`` (1.0): load by which the ranking's second backend must be below the first to
  take a request no engine holds more of than the others (step 7b).
- ``waiting_weight`` (1.0), ``kv_weight`` (2.0): weights of the scraped signals in the load.
- ``max_depth_blocks`` (32), ``hot_share`` (0.5), ``window_requests`` (4096),
  ``min_requests`` (64), ``sketch_width`` (16384): the key choice, see :mod:`.key_choice`.

**Complexity**: O(``max_depth_blocks`` + N log N) per request, plus O(N) for step 7; memory
O(``sketch_width``).

| | prefix_affinity | two_choice | least_loaded | round_robin |
|---|---|---|---|---|
| candidates per prefix | all N, in rendezvous order | 2 (two hashes) | all N | all N |
| state | decayed block counts | counts + last choice per key | none | a counter |
| under overload | heavy keys to next ranks, then least loaded | the other candidate | - | - |
| on a join | ~1/N of keys move, all to the newcomer | ~2/N of keys change a candidate | - | - |
| router replicas agree | yes (same loads) | on candidates | no | no |
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prefixserving.router.policies.base import (
    Decision,
    DecisionReason,
    RoutingContext,
    RoutingPolicy,
)
from prefixserving.router.policies.key_choice import KeyChoice, PrefixKeySelector
from prefixserving.router.policies.load import (
    AffinityLoadParams,
    by_load,
    load_capacity,
    load_values,
)
from prefixserving.router.policies.ranking import NO_IDENTITIES, rendezvous_rank


@dataclass(frozen=True, slots=True)
class PrefixAffinityConfig(AffinityLoadParams):
    """Parameters of :class:`PrefixAffinityPolicy` (see the module docstring)."""

    light_load_bound: float = 2.0
    heavy_share: float = 0.125
    spill_ranks: int = 3
    cache_lead_blocks: int = 1
    balance_gap: float = 1.0

    def __post_init__(self) -> None:
        AffinityLoadParams.__post_init__(self)
        if self.light_load_bound < 1.0:
            raise ValueError("light_load_bound must be at least 1.0")
        if self.heavy_share <= 0:
            raise ValueError("heavy_share must be > 0")
        if self.spill_ranks < 1:
            raise ValueError("spill_ranks must be at least 1")
        if self.cache_lead_blocks < 1:
            raise ValueError("cache_lead_blocks must be at least 1")
        if self.balance_gap < 0:
            raise ValueError("balance_gap must be >= 0")

    def bound_for(self, weight: float, n_backends: int) -> float:
        """The load bound of a key that brings ``weight`` of the traffic to its backend."""
        heaviness = min(1.0, weight * max(n_backends, 1) / self.heavy_share)
        light = max(self.light_load_bound, self.load_bound)
        return light - (light - self.load_bound) * heaviness


def affinity_ranking(
    choice: KeyChoice, backends: Sequence[str], identities: Mapping[str, str] = NO_IDENTITIES
) -> list[str]:
    """Backends in order of preference for ``choice``: rendezvous by the key (over the
    backends' routing ``identities``), among the ``homes`` first choices of its hot parent
    first when it has one."""
    if choice.parent is None:
        return rendezvous_rank(choice.key, backends, identities=identities)
    homes = rendezvous_rank(choice.parent, backends, identities=identities)
    first = rendezvous_rank(choice.key, homes[: choice.homes], identities=identities)
    return first + homes[choice.homes :]


class PrefixAffinityPolicy(RoutingPolicy):
    """Rendezvous ranking of the request's key block, then the first backend within the
    key's load bound, else the least loaded."""

    name = "prefix_affinity"
    affinity = True

    def __init__(self, config: PrefixAffinityConfig | None = None) -> None:
        self.config = config or PrefixAffinityConfig()
        self.selector = PrefixKeySelector(self.config)

    def select(self, ctx: RoutingContext) -> Decision:
        if not ctx.backends:
            raise ValueError("no backends to route to")
        values = load_values(ctx.backends, ctx.loads, self.config.weights)
        choice = self.selector.choose(ctx.blocks, len(ctx.backends))
        if choice is None:
            order = by_load(values, ctx.backends)
            return Decision(order[0], DecisionReason.BALANCE, tuple(order[1:]))
        ranking = affinity_ranking(choice, ctx.backends, ctx.identities)
        bound = self.config.bound_for(choice.weight, len(ctx.backends))
        capacity = load_capacity(values, bound, self.config.load_slack)
        within = [b for b in ranking[: self.config.spill_ranks] if values[b] < capacity]
        order = within + by_load(values, [b for b in ranking if b not in within])
        if not within:
            reason = DecisionReason.FALLBACK
        elif within[0] == ranking[0]:
            reason = DecisionReason.AFFINITY
        else:
            reason = DecisionReason.SPILLED
        if ctx.cached:
            moved = self._by_engine_cache(ctx.cached, ranking, values, capacity)
            if moved is not None and moved[0] != order[0]:
                order.remove(moved[0])
                order.insert(0, moved[0])
                reason = moved[1]
        return Decision(order[0], reason, tuple(order[1:]), choice.key)

    def _by_engine_cache(
        self,
        cached: Mapping[str, int],
        ranking: Sequence[str],
        values: Mapping[str, float],
        capacity: float,
    ) -> tuple[str, DecisionReason] | None:
        """Step 7: the backend that goes first by the engines' cache state, and why; None
        to keep step 4's choice. O(N)."""
        leader = self._cached_leader(cached, ranking, values, capacity)
        if leader is not None:
            return leader, DecisionReason.CACHED
        pair = [b for b in ranking[:2] if values[b] < capacity]
        if (
            len(pair) == 2
            and cached.get(pair[1], 0) >= cached.get(pair[0], 0)
            and values[pair[1]] + self.config.balance_gap < values[pair[0]]
        ):
            return pair[1], DecisionReason.BALANCE
        return None

    def _cached_leader(
        self,
        cached: Mapping[str, int],
        ranking: Sequence[str],
        values: Mapping[str, float],
        capacity: float,
    ) -> str | None:
        """Step 7a: the backend within the bound whose cached depth leads every other one
        within the bound by ``cache_lead_blocks``, else None. O(N)."""
        leader: str | None = None
        best = runner_up = 0
        for backend in ranking:
            if values[backend] >= capacity:
                continue
            depth = cached.get(backend, 0)
            if leader is None or depth > best:
                leader, best, runner_up = backend, depth, best
            elif depth > runner_up:
                runner_up = depth
        if leader is None or best - runner_up < self.config.cache_lead_blocks:
            return None
        return leader

    def on_routed(self, ctx: RoutingContext, decision: Decision) -> None:
        self.selector.observe(ctx.blocks)
