"""``prefix_affinity`` (CLI ``prefix-affinity``): rendezvous ranking by prefix, bounded load.

**Algorithm**

1. Key: observe the request's leading block hashes and take the shallowest block that is not
   hot (:mod:`.keying`): requests behind the same not-hot prefix share a key, and a hot
   prefix such as a system prompt is split by what follows it.
2. Rank the healthy backends by rendezvous hashing of the key (:mod:`.ranking`).
3. Walk the first ``spill_ranks`` backends of the ranking and take the first whose load is
   within the bound ``load < max(ceil(load_bound * m), m + load_slack)`` with
   ``m = (total + 1) / N`` the mean after this request (:mod:`.load`). The
   first-ranked backend is ``affinity``, a later one ``spilled``; a hot key's spill goes to
   the same next choices every time, so those backends warm for it too.
4. None of them within the bound: the least-loaded backend, ``fallback`` (a key that
   overloads ``spill_ranks`` backends is spread by load instead of warming more backends).
   A request without blocks: the least-loaded backend, ``balance``.

Load = in-flight + ``waiting_weight`` x waiting + ``kv_weight`` x KV usage. Two router
replicas with the same backends, loads and traffic make the same choices: the ranking is a
pure function and the key state evolves identically from the same requests.

**Parameters** (:class:`PrefixAffinityConfig`)

- ``load_bound`` (1.25): largest load relative to the mean a backend may reach.
- ``load_slack`` (4.0): a backend within this much load of the mean is never over the bound.
  A relative bound on small counts spills on noise (with 4 backends and one request in
  flight, ``ceil(1.25 * 2 / 4) = 1`` would already push the next request of the same prefix
  elsewhere), and a spill recomputes the whole prefix; SGLang's router likewise requires an
  absolute gap (32) as well as a relative one before it rebalances.
- ``spill_ranks`` (3): backends of the ranking tried before falling back to the least loaded.
- ``waiting_weight`` (1.0), ``kv_weight`` (2.0): weights of the scraped signals in the load.
- ``max_depth_blocks`` (16), ``hot_share`` (0.5), ``window_requests`` (4096),
  ``min_requests`` (64), ``sketch_width`` (16384): the key choice, see :mod:`.keying`.

**Complexity**: O(``max_depth_blocks`` + N log N) per request; memory O(``sketch_width``).

| | prefix_affinity | two_choice | least_loaded | round_robin |
|---|---|---|---|---|
| candidates per prefix | all N, in rendezvous order | 2 (two hashes) | all N | all N |
| state | decayed block counts | counts + last choice per key | none | a counter |
| under overload | next ranks, then least loaded | the other candidate | - | - |
| on a join | ~1/N of keys move, all to the newcomer | ~2/N of keys change a candidate | - | - |
| router replicas agree | yes (same loads) | on candidates | no | no |
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prefixserving.router.policies.base import (
    Decision,
    DecisionReason,
    RoutingContext,
    RoutingPolicy,
)
from prefixserving.router.policies.keying import PrefixKeySelector
from prefixserving.router.policies.load import AffinityLoadParams, least_loaded, load_values
from prefixserving.router.policies.ranking import rendezvous_rank


@dataclass(frozen=True, slots=True)
class PrefixAffinityConfig(AffinityLoadParams):
    """Parameters of :class:`PrefixAffinityPolicy` (see the module docstring)."""

    spill_ranks: int = 3

    def __post_init__(self) -> None:
        AffinityLoadParams.__post_init__(self)
        if self.spill_ranks < 1:
            raise ValueError("spill_ranks must be at least 1")


class PrefixAffinityPolicy(RoutingPolicy):
    """Rendezvous ranking of the request's key block, then the first backend within the
    load bound, else the least loaded."""

    name = "prefix_affinity"

    def __init__(self, config: PrefixAffinityConfig | None = None) -> None:
        self.config = config or PrefixAffinityConfig()
        self.keys = PrefixKeySelector(self.config)

    def select(self, ctx: RoutingContext) -> Decision:
        if not ctx.backends:
            raise ValueError("no backends to route to")
        values = load_values(ctx.backends, ctx.loads, self.config.weights)
        if not ctx.blocks:
            return Decision(least_loaded(values, ctx.backends), DecisionReason.BALANCE)
        key = self.keys.route_key(ctx.blocks, len(ctx.backends))
        assert key is not None
        ranking = rendezvous_rank(key, ctx.backends)
        capacity = self.config.capacity(values)
        for position, backend in enumerate(ranking[: self.config.spill_ranks]):
            if values[backend] < capacity:
                reason = DecisionReason.AFFINITY if position == 0 else DecisionReason.SPILLED
                return Decision(backend, reason)
        return Decision(least_loaded(values, ranking), DecisionReason.FALLBACK)

    def rank(self, blocks: tuple[int, ...], backends: Sequence[str]) -> list[str]:
        key = self.keys.key(blocks, len(backends))
        if key is None:
            return sorted(backends)
        return rendezvous_rank(key, backends)
