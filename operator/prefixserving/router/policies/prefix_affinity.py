"""``prefix_affinity`` (CLI ``prefix-affinity``): rendezvous ranking by prefix, bounded load.

**Algorithm**

1. Key: observe the request's leading block hashes and take the shallowest block that is not
   hot (:mod:`.keying`): requests behind the same not-hot prefix share a key, and a hot
   prefix such as a system prompt is split by what follows it.
2. Rank the healthy backends by rendezvous hashing of the key (:mod:`.ranking`).
3. Walk the first ``spill_ranks`` backends of the ranking and take the first whose load is
   within the bound ``load < ceil(load_bound * (total + 1) / N)`` (:mod:`.load`). The
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
from prefixserving.router.policies.keying import PrefixKeyParams, PrefixKeySelector
from prefixserving.router.policies.load import (
    LoadWeights,
    least_loaded,
    load_capacity,
    load_values,
)
from prefixserving.router.policies.ranking import rendezvous_rank


@dataclass(frozen=True, slots=True)
class PrefixAffinityConfig(PrefixKeyParams):
    """Parameters of :class:`PrefixAffinityPolicy` (see the module docstring)."""

    load_bound: float = 1.25
    load_slack: float = 0.0
    spill_ranks: int = 3
    waiting_weight: float = 1.0
    kv_weight: float = 2.0

    def __post_init__(self) -> None:
        PrefixKeyParams.__post_init__(self)
        if self.load_bound < 1.0:
            raise ValueError("load_bound must be at least 1.0")
        if self.spill_ranks < 1:
            raise ValueError("spill_ranks must be at least 1")


class PrefixAffinityPolicy(RoutingPolicy):
    """Rendezvous ranking of the request's key block, then the first backend within the
    load bound, else the least loaded."""

    name = "prefix_affinity"

    def __init__(self, config: PrefixAffinityConfig | None = None) -> None:
        self.config = config or PrefixAffinityConfig()
        self.keys = PrefixKeySelector(self.config)
        self.weights = LoadWeights(self.config.waiting_weight, self.config.kv_weight)

    def select(self, ctx: RoutingContext) -> Decision:
        if not ctx.backends:
            raise ValueError("no backends to route to")
        values = load_values(ctx.backends, ctx.loads, self.weights)
        if not ctx.blocks:
            return Decision(least_loaded(values, ctx.backends), DecisionReason.BALANCE)
        self.keys.observe(ctx.blocks)
        ranking = self.rank(ctx.blocks, ctx.backends)
        capacity = load_capacity(values, self.config.load_bound, self.config.load_slack)
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
