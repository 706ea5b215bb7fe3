"""``round_robin`` (CLI ``round-robin``): each backend in turn, ignoring prefixes and load.

**Algorithm**

1. Take backend ``counter mod N`` of the sorted healthy backends; ``balance``. The ones
   after it, in turn, are the fallbacks.
2. Once the request is routed (``on_routed``), increment the counter.

Deterministic: two routers that saw the same number of requests pick the same backend.

**Parameters** (:class:`RoundRobinConfig`): none.

**Complexity**: O(N) per request (the fallback list); memory O(1).

| | round_robin | least_loaded | prefix_affinity |
|---|---|---|---|
| looks at | nothing | loads | prefix blocks and loads |
| cache reuse | ~1/N of what one backend would get | ~1/N | most of it |
| balance | equal counts, blind to request size | follows load | bounded (load bound x mean) |
"""

from __future__ import annotations

from dataclasses import dataclass

from prefixserving.router.policies.base import (
    Decision,
    DecisionReason,
    RoutingContext,
    RoutingPolicy,
)


@dataclass(frozen=True, slots=True)
class RoundRobinConfig:
    """:class:`RoundRobinPolicy` has no parameters."""


class RoundRobinPolicy(RoutingPolicy):
    """Each backend in turn."""

    name = "round_robin"

    def __init__(self, config: RoundRobinConfig | None = None) -> None:
        self.config = config or RoundRobinConfig()
        self._counter = 0

    def select(self, ctx: RoutingContext) -> Decision:
        if not ctx.backends:
            raise ValueError("no backends to route to")
        start = self._counter % len(ctx.backends)
        order = ctx.backends[start:] + ctx.backends[:start]
        return Decision(order[0], DecisionReason.BALANCE, order[1:])

    def on_routed(self, ctx: RoutingContext, decision: Decision) -> None:
        self._counter += 1
