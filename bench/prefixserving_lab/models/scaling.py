"""The HPA in the cluster simulator: its control loop over a fleet of simulated engine pods.

**Setup** (:class:`ScalingSetup`): the router policy (prefix affinity by default) in front of a
fleet of simulated engines (:mod:`prefixserving_lab.models.fleet`). Every ``sync_s`` (15 s,
the HPA controller's sync period) the HPA of :mod:`prefixserving.autoscaling.hpa` reads, per
engine pod that exports metrics, ``vllm:kv_cache_usage_perc`` (the replica's pinned share of
its KV blocks), ``vllm:num_requests_waiting`` (its queue) and backlog seconds (its queued
uncached prompt tokens, each shared block once, times the model's prefill seconds per token:
the throughput the real query measures); pods still loading have no metrics. It runs with
the project's default targets and behaviour (what ``prefixserving render`` puts into the
HPA/ScaledObject), on the signal set under test: ``kv`` (KV usage only), ``queue`` (queue
only), ``both`` (KV and queue, the larger proposal), ``backlog`` (backlog seconds only) or
``all`` (the three, the project's default). The simulated engines hold no siblings, so their
queue is what the honest queue depth counts. Scrape and Prometheus rate
windows are not modelled: the HPA sees the values at the sync instant.

:class:`HpaLoop` is that controller, called on every tick of the simulation; it records every
sync (:class:`SyncRecord`) and the Ready pods over time. Cost: O(pods) per tick.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prefixserving.api.scaling import effective_autoscaling
from prefixserving.api.types import AutoscalingSpec
from prefixserving.autoscaling.hpa import SYNC_PERIOD_S, Autoscaler, HpaSpec, hpa_from_autoscaling
from prefixserving_lab.models.cluster import ClusterSim, Tick
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

    def hpa(self, signals: str) -> HpaSpec:
        behavior = (
            {}
            if self.scale_down_window_s is None
            else {
                "behavior": {"scaleDown": {"stabilizationWindowSeconds": self.scale_down_window_s}}
            }
        )
        spec = AutoscalingSpec.model_validate(
            {
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
    """One HPA sync: its time, the replicas before it, the replicas it asked for, Ready pods."""

    time_s: float
    current: int
    desired: int
    ready: int


class HpaLoop:
    """The HPA controller's loop, called on every tick of the cluster simulation."""

    def __init__(self, hpa: Autoscaler, fleet: Fleet, sync_s: float) -> None:
        self.hpa = hpa
        self.fleet = fleet
        self.sync_s = sync_s
        self.next_sync_s = sync_s
        self.syncs: list[SyncRecord] = []
        self.ready_series: list[tuple[float, int]] = []

    def __call__(self, sim: ClusterSim, tick: Tick) -> None:
        self.fleet.on_tick(sim, tick)
        live = [s for s in tick.replicas if not s.draining and s.name in self.fleet.pods]
        ready = sum(1 for s in live if s.ready)
        self.ready_series.append((tick.time_s, ready))
        if tick.time_s < self.next_sync_s:
            return
        self.next_sync_s += self.sync_s
        seconds_per_token = self.fleet.service.prefill_s_per_token
        metrics = {
            "kv": [s.kv_usage for s in live],
            "queue": [float(s.waiting) for s in live],
            "backlog": [s.uncached_waiting_tokens * seconds_per_token for s in live],
        }
        current = self.fleet.size
        desired = self.hpa.sync(tick.time_s, current, metrics, self.fleet.loading())
        self.syncs.append(SyncRecord(tick.time_s, current, desired, ready))
        self.fleet.scale_to(sim, desired)
