"""Engine pods over time for the cluster simulator: start-up, warm-up, readiness, removal.

A pod's life (the Kubernetes side that :class:`~prefixserving_lab.models.cluster.ClusterSim`
does not model): *loading* for ``load_s`` (scheduling, image pull, model load: no metrics, no
traffic), then *warming* (engine up and exporting metrics, not Ready), then *Ready* (routed
to), then *draining* after removal. Without warm-up the warming phase takes no time: the pod
turns Ready when its engine is healthy, with an empty cache.

**Warm-up** (what the ``prefixserving warmup`` sidecar does, simulated): when the engine is
up, the router's hot prefixes are the prefixes shared by at least ``min_hits`` of the requests
that arrived in the last ``window_s``, hottest first; the pod takes up to ``hot_prefixes`` of
them that the routing policy sends to it once it joins the Ready pods, chosen as the router's
hot-prefix endpoint chooses them (an ancestor of a chosen prefix is warmed with it and takes
no slot). In a rolling update the new pod also takes over the cache of the pod it replaces
(the handover: :class:`~prefixserving_lab.models.rollout.RollingUpdate` names that pod; with
engine events the routers send the prefixes it held to whichever pod holds them). Its cache
is filled with them, and warming lasts the prefill of their distinct blocks
(``ServiceModel.prefill_s`` per prefix, one at a time) plus ``warmup_overhead_s``.

**Routing identities**: every pod reports one (its name; with warm-up, a pod started to
replace another inherits that pod's, as the sidecar's handover does), and the routers rank
pods by them (``ClusterSim.identities``), so a successor takes its predecessor's place in
every ranking.

**Removal** (:meth:`Fleet.scale_to`): loading pods go first, then the most recently started
(as a ReplicaSet picks pods to delete).

``started`` lists the pods started during the run (not the seeded ones), in order.
Pod-seconds count every pod from its start until it is removed (loading, warming and
draining time cost a GPU too). Cost: O(pods) per tick; a warm-up costs O(requests in the
window * blocks).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import count

from prefixserving.router.hot import choose_prefixes
from prefixserving.router.policies.base import RoutingPolicy, home_after_join
from prefixserving_lab.models.cluster import ClusterSim, Tick
from prefixserving_lab.models.replica import ServiceModel
from prefixserving_lab.workloads.blocks import chain_block_ids
from prefixserving_lab.workloads.traces import TraceRequest


@dataclass(frozen=True, slots=True)
class PodLifecycle:
    """How long pods take to start and whether they warm up (see the module docstring)."""

    load_s: float = 90.0
    warmup: bool = True
    hot_prefixes: int = 32
    window_s: float = 300.0
    min_hits: int = 2
    warmup_overhead_s: float = 1.0


class HotPrefixWindow:
    """The router's hot prefixes, computed from the requests of the last ``window_s``."""

    def __init__(self, requests: Sequence[TraceRequest], window_s: float, min_hits: int) -> None:
        self._arrivals = [r.arrival_s for r in requests]
        self._chains = [chain_block_ids(r.block_ids) for r in requests]
        self.window_s = window_s
        self.min_hits = min_hits
        self._memo: tuple[float, list[tuple[int, ...]]] | None = None

    def hot(self, now_s: float) -> list[tuple[int, ...]]:
        """Shared prefixes of the window, hottest first (ties: shorter chain first)."""
        if self._memo is None or self._memo[0] != now_s:
            self._memo = (now_s, self._compute(now_s))
        return self._memo[1]

    def _compute(self, now_s: float) -> list[tuple[int, ...]]:
        lo = bisect.bisect_left(self._arrivals, now_s - self.window_s)
        hi = bisect.bisect_right(self._arrivals, now_s)
        counts: Counter[int] = Counter()
        chains: dict[int, tuple[int, ...]] = {}
        for chain in self._chains[lo:hi]:
            for depth, block in enumerate(chain, start=1):
                counts[block] += 1
                if block not in chains:
                    chains[block] = chain[:depth]
        shared = [b for b, n in counts.items() if n >= self.min_hits]
        shared.sort(key=lambda b: (-counts[b], len(chains[b]), b))
        return [chains[b] for b in shared]


@dataclass(slots=True)
class _Pod:
    name: str
    started_s: float
    engine_up_s: float
    in_sim: bool = False
    replaces: str | None = None
    identity: str = ""


@dataclass
class Fleet:
    """The engine pods of one Deployment, driven from ``ClusterSim.on_tick``."""

    lifecycle: PodLifecycle
    policy: RoutingPolicy
    service: ServiceModel
    hot: HotPrefixWindow | None = None
    prefix: str = "pod"
    pods: dict[str, _Pod] = field(default_factory=dict, init=False)
    pod_seconds: float = field(default=0.0, init=False)
    started: list[str] = field(default_factory=list, init=False)
    _names: count = field(default_factory=count, init=False)
    _last_s: float = field(default=0.0, init=False)
    _draining: set[str] = field(default_factory=set, init=False)

    @property
    def size(self) -> int:
        """Pods that count as replicas of the Deployment (not the draining ones)."""
        return len(self.pods)

    def loading(self) -> int:
        return sum(1 for p in self.pods.values() if not p.in_sim)

    def seed(self, sim: ClusterSim, replicas: int) -> None:
        """The fleet before the run: ``replicas`` pods, Ready at time 0 with empty caches."""
        for _ in range(replicas):
            name = f"{self.prefix}-{next(self._names)}"
            self.pods[name] = _Pod(name, 0.0, 0.0, in_sim=True, identity=name)
            sim.add_replica(name, at_s=0.0, identity=name)

    def start(self, now_s: float, replaces: str | None = None) -> str:
        """Start one pod; its engine is up ``load_s`` later. ``replaces``: the pod it is to
        replace in a rolling update (its warm-up takes that pod's share over, and it inherits
        that pod's routing identity)."""
        name = f"{self.prefix}-{next(self._names)}"
        handover = self.lifecycle.warmup and replaces in self.pods  # the sidecar does it
        identity = self.pods[replaces].identity if handover else name
        up_s = now_s + self.lifecycle.load_s
        self.pods[name] = _Pod(name, now_s, up_s, replaces=replaces, identity=identity)
        self.started.append(name)
        return name

    def scale_to(self, sim: ClusterSim, desired: int) -> None:
        """Start or remove pods until ``desired`` count as replicas."""
        while self.size < desired:
            self.start(sim.now)
        if self.size <= desired:
            return
        order = list(self.pods)  # insertion order: oldest first
        victims = sorted(
            self.pods.values(), key=lambda p: (p.in_sim, -p.started_s, -order.index(p.name))
        )
        for pod in victims[: self.size - desired]:
            self.remove(sim, pod.name)

    def remove(self, sim: ClusterSim, name: str) -> None:
        pod = self.pods.pop(name)
        if pod.in_sim:
            sim.remove_replica(name)
            self._draining.add(name)

    def on_tick(self, sim: ClusterSim, tick: Tick) -> None:
        """Account pod time and bring up the pods whose engine is now up."""
        in_sim = {s.name for s in tick.replicas}
        self._draining &= in_sim
        self.pod_seconds += (tick.time_s - self._last_s) * (len(self.pods) + len(self._draining))
        self._last_s = tick.time_s
        for pod in sorted(self.pods.values(), key=lambda p: p.name):
            if not pod.in_sim and pod.engine_up_s <= tick.time_s:
                self._bring_up(sim, pod)

    def _bring_up(self, sim: ClusterSim, pod: _Pod) -> None:
        pod.in_sim = True
        if not self.lifecycle.warmup or self.hot is None:
            sim.add_replica(pod.name, identity=pod.identity)
            return
        chains = self.owned_prefixes(sim, pod.name, pod.replaces)
        seen: set[int] = set()
        warm_s = self.lifecycle.warmup_overhead_s
        for chain in chains:
            new = [b for b in chain if b not in seen]
            seen.update(new)
            warm_s += self.service.prefill_s(len(new) * self.service.block_tokens)
        sim.add_replica(pod.name, ready_delay_s=warm_s, warm=chains, identity=pod.identity)

    def owned_prefixes(
        self, sim: ClusterSim, member: str, replaces: str | None = None
    ) -> list[tuple[int, ...]]:
        """The hot prefixes ``member`` owns once it joins the Ready pods and, with
        ``replaces``, takes over that pod's cache and routing identity
        (``policies.base.home_after_join``), chosen as the router's hot-prefix endpoint
        chooses them (``router.hot.choose_prefixes``)."""
        assert self.hot is not None
        backends = sim.ready_backends()

        def owned(chain: tuple[int, ...]) -> bool:
            cached = sim.cached(chain, backends)
            after = home_after_join(
                self.policy, chain, backends, member, replaces, cached, sim.identities
            )
            return after == member

        return choose_prefixes(
            self.hot.hot(sim.now), lambda c: c, self.lifecycle.hot_prefixes, owned
        )
