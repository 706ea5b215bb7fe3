"""A rolling update in the cluster simulator (a Deployment with ``maxSurge: 1``,
``maxUnavailable: 0``, as the operator renders it).

:class:`RollingUpdate`, called on every tick: at ``start_s`` one new pod starts; when it is
Ready one old pod is removed (it drains what it holds) and, the terminating pod no longer
counting, the next new pod starts at once; this repeats until no old pod is left. A new pod is
Ready after ``load_s`` without warm-up, or after ``load_s`` plus its warm-up with it
(:mod:`prefixserving_lab.models.fleet`: the hot prefixes it owns among the Ready pods at that
moment, and with ``handover`` what the old pod it replaces holds, as the warm-up sidecar's
handover does). Routing uses the Ready pods only, so a warming pod takes no traffic.

:class:`RolloutSetup`: the traffic (the conversation workload of
:mod:`prefixserving_lab.workloads.conversations` at a steady compression, no bursts), the
router policy, the pods and when the rollout starts. Cost: O(pods) per tick.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prefixserving_lab.models.cluster import ClusterSim, Tick
from prefixserving_lab.models.fleet import Fleet, PodLifecycle
from prefixserving_lab.models.replica import ServiceModel
from prefixserving_lab.models.scaling import DEFAULT_SERVICE
from prefixserving_lab.workloads.conversations import BurstSchedule, ConversationShape


@dataclass(frozen=True, slots=True)
class RolloutSetup:
    """The traffic, the fleet and the rollout's start (module docstring)."""

    schedule: BurstSchedule = field(
        default_factory=lambda: BurstSchedule(duration_s=1800.0, base_scale=4.0, bursts=())
    )
    shape: ConversationShape = field(default_factory=ConversationShape)
    service: ServiceModel = DEFAULT_SERVICE
    lifecycle: PodLifecycle = field(default_factory=PodLifecycle)
    replicas: int = 4
    start_s: float = 600.0
    policy: str = "prefix-affinity"


class RollingUpdate:
    """Replaces the seeded pods one at a time from ``start_s`` (surge 1, unavailable 0);
    with ``handover`` (``spec.warmup.handover``) each new pod is started as the successor of
    the old pod removed when it is Ready, and warms that pod's share too."""

    def __init__(self, fleet: Fleet, start_s: float | None, handover: bool = True) -> None:
        self.fleet = fleet
        self.start_s = start_s
        self.handover = handover
        self.old: list[str] = []
        self.current: str | None = None
        self.finished_s: float | None = None

    def __call__(self, sim: ClusterSim, tick: Tick) -> None:
        self.fleet.on_tick(sim, tick)
        if self.start_s is None or tick.time_s < self.start_s or self.finished_s is not None:
            return
        if self.current is None:
            self.old = sorted(self.fleet.pods)
            self.current = self._start_next(tick.time_s)
            return
        ready = {s.name for s in tick.replicas if s.ready and not s.draining}
        if self.current not in ready:
            return
        self.fleet.remove(sim, self.old.pop(0))
        if self.old:
            self.current = self._start_next(tick.time_s)
        else:
            self.finished_s = tick.time_s

    def _start_next(self, now_s: float) -> str:
        return self.fleet.start(now_s, self.old[0] if self.handover else None)
