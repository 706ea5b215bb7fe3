"""``least_loaded`` (CLI ``least-loaded``): the backend with the least load, ignoring prefixes.

**Algorithm**

1. Load of each backend: max(in-flight, running + ``waiting_weight`` x waiting) +
   ``kv_weight`` x KV usage (:mod:`.load`).
2. Take the least loaded; among equals, the first at or after a rotating start position (one
   step per routed request), so an idle fleet is filled in turn rather than always from the
   first backend; ``balance``. The others, by load, are the fallbacks.

**Parameters** (:class:`LeastLoadedConfig`)

- ``waiting_weight`` (1.0), ``kv_weight`` (2.0): weights of the scraped signals in the load.

**Complexity**: O(N log N) per request (the backends sorted by load); memory O(1).

| | least_loaded | round_robin | prefix_affinity |
|---|---|---|---|
| looks at | loads | nothing | prefix blocks and loads |
| cache reuse | ~1/N of what one backend would get | ~1/N | most of it |
| balance | follows load (best TTFT without reuse) | equal counts | bounded (load bound x mean) |
"""

from __future__ import annotations

from dataclasses import dataclass

from prefixserving.router.policies.base import (
    Decision,
    DecisionReason,
    RoutingContext,
    RoutingPolicy,
)
from prefixserving.router.policies.load import LoadWeights, by_load, load_values


@dataclass(frozen=True, slots=True)
class LeastLoadedConfig:
    """Parameters of :class:`LeastLoadedPolicy` (see the module docstring)."""

    waiting_weight: float = 1.0
    kv_weight: float = 2.0


class LeastLoadedPolicy(RoutingPolicy):
    """The least-loaded backend; ties rotate."""

    name = "least_loaded"

    def __init__(self, config: LeastLoadedConfig | None = None) -> None:
        self.config = config or LeastLoadedConfig()
        self.weights = LoadWeights(self.config.waiting_weight, self.config.kv_weight)
        self._counter = 0

    def select(self, ctx: RoutingContext) -> Decision:
        if not ctx.backends:
            raise ValueError("no backends to route to")
        start = self._counter % len(ctx.backends)
        order = ctx.backends[start:] + ctx.backends[:start]
        values = load_values(ctx.backends, ctx.loads, self.weights)
        ranked = by_load(values, order)
        return Decision(ranked[0], DecisionReason.BALANCE, tuple(ranked[1:]))

    def on_routed(self, ctx: RoutingContext, decision: Decision) -> None:
        self._counter += 1
