"""The HPA in the cluster simulator: its control loop over a fleet of simulated engine pods.

**Setup** (:class:`ScalingSetup`): the router policy (prefix affinity by default) in front of a
fleet of simulated engines (:mod:`prefixserving_lab.models.fleet`). Every ``sync_s`` (15 s,
the HPA controller's sync period) the HPA of :mod:`prefixserving.autoscaling.hpa` reads, per
engine pod that exports metrics, ``vllm:kv_cache_usage_perc`` (the replica's pinned share of
its KV blocks), queue depth and backlog seconds (its queued uncached prompt tokens times the
model's prefill seconds per token: the throughput the real query measures); pods still loading
have no metrics. It runs with the project's default targets and behaviour (what ``prefixserving
render`` puts into the HPA/ScaledObject; ``backlog_target_s`` overrides the backlog target, as
``spec.autoscaling.targets.backlogSeconds`` does), on the signal set under test: ``kv`` (KV
usage only), ``queue`` (queue only), ``both`` (KV and queue, the larger proposal),
``backlog`` (backlog seconds only) or ``all`` (the three, the project's default).

**Held siblings** (:meth:`~prefixserving_lab.models.replica.Replica.held_siblings`): waiting
requests whose shared blocks the request in prefill is computing. Honest (``count_held``
false, what the operator's queries read from a PEEK engine): queue depth is the waiting
requests less the held ones, backlog counts a shared block once and the pioneer's blocks not
at all. Counted (``count_held``, the stock gauges): queue depth is every waiting request and
each request's own uncached tokens add up. KV usage is the same either way (a held sibling pins
no blocks). Scrape and Prometheus rate windows are not modelled: the HPA sees the values at the
sync instant.

**Bursts** (:class:`Burst`): named windows of the workload (the schedule's bursts unless the
setup lists its own) the runner measures reaction times against.

:class:`HpaLoop` is that controller, called on every tick of the simulation; it records every
sync (:class:`SyncRecord`, with the mean of each signal it read) and the Ready pods over time.
Cost: O(pods) per tick, O(queued blocks) per sync.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from prefixserving.api.scaling import effective_autoscaling
from prefixserving.api.types import AutoscalingSpec
from prefixserving.autoscaling.hpa import SYNC_PERIOD_S, Autoscaler, HpaSpec, hpa_from_autoscaling
from prefixserving_lab.models.cluster import ClusterSim, ReplicaSample, Tick
from prefixserving_lab.models.fleet import Fleet, PodLifecycle
from prefixserving_lab.models.replica import ServiceModel
from prefixserving_lab.workloads.conversations import BurstSchedule, ConversationShape

SIGNAL_SETS: dict[str, tuple[str, ...]] = {
    "kv": ("kvCacheUsage",),
    "queue": ("queueDepth",),
    "both": ("kvCacheUsage", "queueDepth"),
    "backlog": ("backlogSeconds",),
    "all": ("kvCacheUsage", "queueDepth", "backlogSeconds"),
}
_METRICS = {"kvCacheUsage": "kv", "queueDepth": "queue", "backlogSeconds": "backlog"}

# A replica with a small KV cache for its concurrency, so KV usage is a live signal:
# 640 blocks of 128 tokens (82k tokens), 64 sequences, about 15k prefill tokens/s.
DEFAULT_SERVICE = ServiceModel(cache_blocks=640, block_tokens=128, max_running=64)


@dataclass(frozen=True, slots=True)
class Burst:
    """A burst of the workload: its kind (what the report groups by) and window."""

    kind: str
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True)
class ScalingSetup:
    """Everything a run depends on besides the signals and warm-up."""

    schedule: BurstSchedule = field(default_factory=BurstSchedule)
    shape: ConversationShape = field(default_factory=ConversationShape)
    service: ServiceModel = DEFAULT_SERVICE
    lifecycle: PodLifecycle = field(default_factory=PodLifecycle)
    min_replicas: int = 2
    max_replicas: int = 16
    policy: str = "prefix-affinity"
    sync_s: float = SYNC_PERIOD_S
    scale_down_window_s: int | None = None  # None: the project's default
    bursts: tuple[Burst, ...] | None = None  # None: the schedule's windows, kind "burst"
    backlog_target_s: float | None = None  # None: the project's default

    def burst_windows(self) -> tuple[Burst, ...]:
        if self.bursts is not None:
            return self.bursts
        return tuple(Burst("burst", a, b) for a, b in self.schedule.bursts)

    def in_burst(self, time_s: float, after_s: float = 0.0) -> bool:
        """Whether ``time_s`` falls in a burst window, extended by ``after_s``."""
        return any(b.start_s <= time_s < b.end_s + after_s for b in self.burst_windows())

    def hpa(self, signals: str) -> HpaSpec:
        behavior = (
            {}
            if self.scale_down_window_s is None
            else {
                "behavior": {"scaleDown": {"stabilizationWindowSeconds": self.scale_down_window_s}}
            }
        )
        targets = (
            {}
            if self.backlog_target_s is None
            else {"targets": {"backlogSeconds": self.backlog_target_s}}
        )
        spec = AutoscalingSpec.model_validate(
            {
                **targets,
                "enabled": True,
                "backend": "hpa",
                "minReplicas": self.min_replicas,
                "maxReplicas": self.max_replicas,
                "signals": list(SIGNAL_SETS[signals]),
                **behavior,
            }
        )
        return hpa_from_autoscaling(effective_autoscaling(spec), _METRICS)


@dataclass(frozen=True, slots=True)
class SyncRecord:
    """One HPA sync: its time, the replicas before it, the replicas it asked for, Ready pods,
    the mean per reporting pod of each signal (``kv``, ``queue``, ``backlog``), and of two
    loads no signal reads: ``prefill_busy`` (the share of the last sync period the pod's
    prefill server computed) and ``slots`` (running requests over ``max_running``); 0 with no
    pod reporting."""

    time_s: float
    current: int
    desired: int
    ready: int
    means: dict[str, float] = field(default_factory=dict)


class HpaLoop:
    """The HPA controller's loop, called on every tick of the cluster simulation."""

    def __init__(
        self, hpa: Autoscaler, fleet: Fleet, sync_s: float, count_held: bool = False
    ) -> None:
        self.hpa = hpa
        self.fleet = fleet
        self.sync_s = sync_s
        self.count_held = count_held
        self.next_sync_s = sync_s
        self.syncs: list[SyncRecord] = []
        self.ready_series: list[tuple[float, int]] = []
        self._busy_at_sync: dict[str, float] = {}

    def __call__(self, sim: ClusterSim, tick: Tick) -> None:
        self.fleet.on_tick(sim, tick)
        live = [s for s in tick.replicas if not s.draining and s.name in self.fleet.pods]
        ready = sum(1 for s in live if s.ready)
        self.ready_series.append((tick.time_s, ready))
        if tick.time_s < self.next_sync_s:
            return
        self.next_sync_s += self.sync_s
        metrics = self.signals(sim, live)
        current = self.fleet.size
        desired = self.hpa.sync(tick.time_s, current, metrics, self.fleet.loading())
        loads = {
            "prefill_busy": [
                (s.prefill_busy_s - self._busy_at_sync.get(s.name, s.prefill_busy_s)) / self.sync_s
                for s in live
            ],
            "slots": [s.running / self.fleet.service.max_running for s in live],
        }
        self._busy_at_sync = {s.name: s.prefill_busy_s for s in tick.replicas}
        means = {k: sum(v) / len(v) if v else 0.0 for k, v in (metrics | loads).items()}
        self.syncs.append(SyncRecord(tick.time_s, current, desired, ready, means))
        self.fleet.scale_to(sim, desired)

    def signals(self, sim: ClusterSim, pods: Sequence[ReplicaSample]) -> dict[str, list[float]]:
        """Each signal of each pod that exports metrics, held siblings counted or not."""
        seconds_per_token = self.fleet.service.prefill_s_per_token
        replicas = [sim.replicas[s.name] for s in pods]
        held = [0 if self.count_held else r.held_siblings() for r in replicas]
        return {
            "kv": [s.kv_usage for s in pods],
            "queue": [float(s.waiting - h) for s, h in zip(pods, held, strict=True)],
            "backlog": [
                r.uncached_waiting_tokens(self.count_held) * seconds_per_token for r in replicas
            ],
        }
