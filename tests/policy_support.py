"""Shared pieces of the routing-policy tests: eight backends and seeded random traffic."""

from __future__ import annotations

import random

from prefixserving.router.policies.base import BackendLoad, RoutingContext

BACKENDS = tuple(f"10.0.0.{i}:8000" for i in range(8))


def random_traffic(seed: int, count: int, *, cached: bool = False) -> list[RoutingContext]:
    """``count`` requests from 40 prefixes (first block shared, then 2 own blocks) with random
    loads on :data:`BACKENDS`; with ``cached``, also a random cached depth (0-3 blocks, 0 half
    the time) on every backend, as a router following the engines' KV events sees it."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        group = rng.randrange(40)
        blocks = (1000 + group, 5000 + group * 7, rng.getrandbits(64))
        loads = {b: BackendLoad(rng.randrange(6), rng.randrange(3), rng.random()) for b in BACKENDS}
        depths = {b: rng.choice((0, 0, 0, 1, 2, 3)) for b in BACKENDS} if cached else {}
        out.append(RoutingContext(blocks, BACKENDS, loads, depths))
    return out
