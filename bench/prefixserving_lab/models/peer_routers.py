"""Peer routers' algorithms as policies, for the cluster benchmark only (not in the router).

Both run through the same :class:`RoutingPolicy` interface as ours, so the simulator treats
all policies alike.

``kubeai_chwbl``: KubeAI's consistent hashing with bounded loads (``PrefixHash`` strategy).

1. Key: the first 100 characters of the first user message; here the first block's key, the
   simulator's closest equivalent (a block is 512 tokens, so it covers more).
2. A ring with ``virtual_nodes`` points per backend (BLAKE2b of ``"<backend><i>"``).
3. From the key's point, walk clockwise and take the first backend whose in-flight count
   satisfies ``in_flight + 1 <= load_factor * (total_in_flight + 1) / N`` (always true when
   nothing is in flight); if none does, the least loaded (``fallback``).

Defaults: 256 virtual nodes, load factor 1.25. O(log(N * virtual_nodes) + N) per request.

``sglang_cache_aware``: SGLang's cache-aware router (``cache_aware`` policy).

1. Load = the router's in-flight count per backend. If ``max - min > balance_abs_threshold``
   and ``max > balance_rel_threshold * min``, take the least loaded (``fallback``).
2. Otherwise find the backend whose approximate tree (the prefixes routed to it) matches the
   most leading blocks of the request. If the match covers more than ``cache_threshold`` of
   the request, take it (``affinity``); else the backend with the smallest tree
   (``balance``: the most free cache).
3. Insert the request's blocks into the chosen backend's tree; each tree keeps its
   ``max_tree_blocks`` most recently used prefixes (SGLang evicts by LRU on a timer).

Defaults as in SGLang's router: cache threshold 0.5, balance thresholds 32 and 1.1 (its
documented ranges are 0.3-0.5, 32-64 and 1.1-1.5); the tree bound defaults to 2**16 blocks
(32M tokens), so eviction rarely matters. O(N * request blocks) per request.

| | prefix_affinity (ours) | kubeai_chwbl | sglang_cache_aware |
|---|---|---|---|
| key | shallowest not-hot block | first 100 characters | whole prompt |
| router replicas agree | yes (same traffic) | yes | no: trees per router |
| balance | bound on in-flight, queue, KV | bound on in-flight | past abs + rel gap |
"""

from __future__ import annotations

import bisect
import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from prefixserving.router.policies.base import (
    Decision,
    DecisionReason,
    RoutingContext,
    RoutingPolicy,
)
from prefixserving.router.policies.prefix_affinity import PrefixAffinityPolicy
from prefixserving.router.policies.registry import make_policy


@dataclass(frozen=True, slots=True)
class KubeaiChwblConfig:
    """KubeAI's own defaults (its load factor happens to equal our router's load bound; it
    is KubeAI's figure, not ours, and does not follow ours)."""

    virtual_nodes: int = 256
    load_factor: float = 1.25


class KubeaiChwblPolicy(RoutingPolicy):
    """KubeAI's consistent hashing with bounded loads on the first block."""

    name = "kubeai_chwbl"

    def __init__(self, config: KubeaiChwblConfig | None = None) -> None:
        self.config = config or KubeaiChwblConfig()
        self._ring_for: tuple[str, ...] = ()
        self._points: list[int] = []
        self._owners: list[str] = []

    def _ring(self, backends: tuple[str, ...]) -> None:
        if backends == self._ring_for:
            return
        points = sorted(
            (_hash64(f"{backend}{i}".encode()), backend)
            for backend in backends
            for i in range(self.config.virtual_nodes)
        )
        self._points = [p for p, _ in points]
        self._owners = [b for _, b in points]
        self._ring_for = backends

    def select(self, ctx: RoutingContext) -> Decision:
        self._ring(ctx.backends)
        in_flight = {b: ctx.loads[b].in_flight if b in ctx.loads else 0 for b in ctx.backends}
        total = sum(in_flight.values())
        key = _hash64(ctx.blocks[0].to_bytes(8, "big")) if ctx.blocks else 0
        start = bisect.bisect_left(self._points, key) % len(self._points)
        tried: set[str] = set()
        for step in range(len(self._points)):
            backend = self._owners[(start + step) % len(self._points)]
            if backend in tried:
                continue
            if self._load_ok(in_flight[backend], total, len(ctx.backends)):
                reason = DecisionReason.AFFINITY if not tried else DecisionReason.SPILLED
                return Decision(backend, reason)
            tried.add(backend)
            if len(tried) == len(ctx.backends):
                break
        return Decision(min(ctx.backends, key=lambda b: in_flight[b]), DecisionReason.FALLBACK)

    def _load_ok(self, load: int, total: int, n: int) -> bool:
        return total == 0 or load + 1 <= self.config.load_factor * (total + 1) / n


@dataclass(frozen=True, slots=True)
class SglangCacheAwareConfig:
    cache_threshold: float = 0.5
    balance_abs_threshold: int = 32
    balance_rel_threshold: float = 1.1
    max_tree_blocks: int = 1 << 16


class SglangCacheAwarePolicy(RoutingPolicy):
    """SGLang's approximate per-backend prefix trees with an imbalance override."""

    name = "sglang_cache_aware"

    def __init__(self, config: SglangCacheAwareConfig | None = None) -> None:
        self.config = config or SglangCacheAwareConfig()
        # Chained block keys identify prefixes, so a set of them is a radix tree at block
        # granularity; the order is the LRU order used for eviction.
        self._trees: dict[str, OrderedDict[int, None]] = {}

    def select(self, ctx: RoutingContext) -> Decision:
        for gone in set(self._trees) - set(ctx.backends):
            del self._trees[gone]
        trees = {b: self._trees.setdefault(b, OrderedDict()) for b in ctx.backends}
        in_flight = {b: ctx.loads[b].in_flight if b in ctx.loads else 0 for b in ctx.backends}
        low, high = min(in_flight.values()), max(in_flight.values())
        cfg = self.config
        if high - low > cfg.balance_abs_threshold and high > cfg.balance_rel_threshold * low:
            backend = min(ctx.backends, key=lambda b: in_flight[b])
            reason = DecisionReason.FALLBACK
        else:
            matched = {b: _match(trees[b], ctx.blocks) for b in ctx.backends}
            best = max(ctx.backends, key=lambda b: matched[b])
            if ctx.blocks and matched[best] / len(ctx.blocks) > cfg.cache_threshold:
                backend, reason = best, DecisionReason.AFFINITY
            else:
                backend = min(ctx.backends, key=lambda b: len(trees[b]))
                reason = DecisionReason.BALANCE
        _insert(trees[backend], ctx.blocks, cfg.max_tree_blocks)
        return Decision(backend, reason)

    def tree(self, backend: str) -> frozenset[int]:
        """The chained block keys this router's tree holds for ``backend``."""
        return frozenset(self._trees.get(backend, ()))


def _hash64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def _match(tree: OrderedDict[int, None], blocks: tuple[int, ...]) -> int:
    for i, block in enumerate(blocks):
        if block not in tree:
            return i
    return len(blocks)


def _insert(tree: OrderedDict[int, None], blocks: tuple[int, ...], limit: int) -> None:
    for block in blocks:
        tree[block] = None
        tree.move_to_end(block)
    while len(tree) > limit:
        tree.popitem(last=False)


BASELINES: dict[str, type[RoutingPolicy]] = {
    KubeaiChwblPolicy.name: KubeaiChwblPolicy,
    SglangCacheAwarePolicy.name: SglangCacheAwarePolicy,
}


# Router policies simulated with the engines' KV cache events (``ClusterConfig.kv_events``,
# ``RoutingContext.cached`` filled): the simulated name, and the router policy it runs.
PREFIX_AFFINITY_EVENTS = "prefix_affinity_events"
WITH_KV_EVENTS: dict[str, str] = {PREFIX_AFFINITY_EVENTS: PrefixAffinityPolicy.name}


def sim_policy_key(name: str) -> str:
    """``prefix-affinity-events`` -> ``prefix_affinity_events``: the name a run is reported by."""
    return name.strip().lower().replace("-", "_")


def follows_kv_events(name: str) -> bool:
    """Whether the simulated policy ``name`` routes with the engines' KV cache events."""
    return sim_policy_key(name) in WITH_KV_EVENTS


def make_sim_policy(name: str) -> RoutingPolicy:
    """A router policy (``prefix-affinity`` ...), a baseline (``kubeai-chwbl`` ...) or a router
    policy run with engine events (``prefix-affinity-events``: the router's policy object)."""
    key = sim_policy_key(name)
    if key in BASELINES:
        return BASELINES[key]()
    return make_policy(WITH_KV_EVENTS.get(key, key))


def sim_policy_names(router_names: Sequence[str]) -> list[str]:
    """The router's policies, those run with engine events, then the baselines."""
    return [*router_names, *WITH_KV_EVENTS, *BASELINES]
