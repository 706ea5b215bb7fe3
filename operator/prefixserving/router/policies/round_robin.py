"""``round_robin`` (CLI ``round-robin``): each backend in turn, ignoring prefixes and load.

**Algorithm**

1. Take backend ``counter mod N`` of the sorted healthy backends; ``balance``.
2. Increment the counter.

Deterministic: two routers that saw the same number of requests pick the same backend.

**Parameters** (:class:`RoundRobinConfig`): none.

**Complexity**: O(1) per request; memory O(1).

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
        backend = ctx.backends[self._counter % len(ctx.backends)]
        self._counter += 1
        return Decision(backend, DecisionReason.BALANCE)
