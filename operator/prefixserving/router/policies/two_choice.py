"""``two_choice`` (CLI ``two-choice``): DualMap's two hashed candidates (arXiv 2602.06502).

DualMap (Yuan et al., ICLR 2026) maps each request to two candidate instances with two
independent hashes of its prompt and picks between them by cache affinity and load, so
requests with a shared prefix meet on at most two instances while distinct prefixes spread
by "the power of two choices".

**Algorithm**

1. Key: the same key block as ``prefix_affinity`` (:mod:`.key_choice`; DualMap also adapts the
   hashed prefix length).
2. Candidates: the rendezvous winner under seed A, and the winner under seed B among the
   other backends (two independent hash functions; distinct when N >= 2).
3. Affinity: the candidate that served this key last (a bounded LRU of key -> backend,
   standing in for DualMap's knowledge of where the prefix is cached). If it is within the
   load bound of ``prefix_affinity`` take it: ``affinity``.
   DualMap's rule is "affinity until the TTFT SLO is at risk"; the bound is its load proxy.
4. Otherwise the less loaded candidate (ties: the first): ``spilled`` when that is not the
   recorded one, ``balance`` for a key seen for the first time (or whose recorded backend is
   no longer a candidate). The other candidate is the decision's only fallback.
5. Once routed (``on_routed``): record the key's backend, then count the request's blocks.

Only the two candidates are ever used, as in DualMap; its hotspot migration (moving queued
requests) and dual hash ring are out of scope for a router that does not hold queues.

**Parameters** (:class:`TwoChoiceConfig`)

- ``load_bound`` (1.25), ``load_slack`` (4.0), ``waiting_weight`` (1.0), ``kv_weight``
  (2.0): as in ``prefix_affinity``.
- ``affinity_entries`` (65536): keys remembered with their last backend (LRU).
- ``max_depth_blocks`` (32), ``hot_share`` (0.5), ``window_requests`` (4096),
  ``min_requests`` (64), ``sketch_width`` (16384): the key choice, see :mod:`.key_choice`.

**Complexity**: O(``max_depth_blocks`` + N) per request; memory O(``sketch_width`` +
``affinity_entries``).

| | two_choice | prefix_affinity |
|---|---|---|
| candidates per prefix | 2 | all N in rendezvous order |
| hot prefix | split over 2 backends | stays on the first until the bound, then the second... |
| balance | power of two choices, never a third backend | bounded load over all N |
| state | counts + last choice per key | counts |
| router replicas agree | on candidates; the pick follows each router's loads and memory | yes |
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prefixserving.router.policies.base import (
    Decision,
    DecisionReason,
    RoutingContext,
    RoutingPolicy,
)
from prefixserving.router.policies.key_choice import PrefixKeySelector
from prefixserving.router.policies.load import AffinityLoadParams, by_load, load_values
from prefixserving.router.policies.ranking import NO_IDENTITIES, rendezvous_top

_SEED_A = 0x243F6A8885A308D3
_SEED_B = 0x13198A2E03707344


@dataclass(frozen=True, slots=True)
class TwoChoiceConfig(AffinityLoadParams):
    """Parameters of :class:`TwoChoicePolicy` (see the module docstring)."""

    affinity_entries: int = 65536

    def __post_init__(self) -> None:
        AffinityLoadParams.__post_init__(self)
        if self.affinity_entries < 1:
            raise ValueError("affinity_entries must be at least 1")


class TwoChoicePolicy(RoutingPolicy):
    """Two hashed candidates per key; the cached one unless over the load bound."""

    name = "two_choice"
    affinity = True

    def __init__(self, config: TwoChoiceConfig | None = None) -> None:
        self.config = config or TwoChoiceConfig()
        self.selector = PrefixKeySelector(self.config)
        self._last: OrderedDict[int, str] = OrderedDict()

    @staticmethod
    def candidates(
        key: int, backends: Sequence[str], identities: Mapping[str, str] = NO_IDENTITIES
    ) -> list[str]:
        """The two candidates of ``key`` (one when there is one backend), ranked by the
        backends' routing ``identities`` (``policies.ranking``)."""
        first = rendezvous_top(key, backends, _SEED_A, identities)
        others = [b for b in backends if b != first]
        return [first, rendezvous_top(key, others, _SEED_B, identities)] if others else [first]

    def select(self, ctx: RoutingContext) -> Decision:
        if not ctx.backends:
            raise ValueError("no backends to route to")
        values = load_values(ctx.backends, ctx.loads, self.config.weights)
        key = self.selector.key(ctx.blocks, len(ctx.backends))
        if key is None:
            order = by_load(values, ctx.backends)
            return Decision(order[0], DecisionReason.BALANCE, tuple(order[1:]))
        pair = self.candidates(key, ctx.backends, ctx.identities)
        cached = self._last.get(key)
        capacity = self.config.capacity(values)
        if cached in pair and values[cached] < capacity:
            backend = cached
        else:
            backend = by_load(values, pair)[0]
        if backend == cached:
            reason = DecisionReason.AFFINITY
        else:
            reason = DecisionReason.SPILLED if cached in pair else DecisionReason.BALANCE
        return Decision(backend, reason, tuple(b for b in pair if b != backend), key)

    def on_routed(self, ctx: RoutingContext, decision: Decision) -> None:
        """Remember the backend of the request's key (bounded LRU), then count its blocks. The
        key is read before the count, so it is the key :meth:`select` chose by."""
        key = self.selector.key(ctx.blocks, len(ctx.backends))
        self.selector.observe(ctx.blocks)
        if key is None:
            return
        self._last[key] = decision.backend
        self._last.move_to_end(key)
        while len(self._last) > self.config.affinity_entries:
            self._last.popitem(last=False)

    def on_served(self, decision: Decision, served: str) -> None:
        """The key's cache is on ``served`` now: remember it instead of the decision's backend
        (unless a later request of the key was routed since)."""
        key = decision.key
        if key is not None and self._last.get(key) == decision.backend:
            self._last[key] = served
