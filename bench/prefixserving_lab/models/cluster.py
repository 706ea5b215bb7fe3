"""Discrete-event simulation of a router in front of engine replicas.

Each request arrives at one of the router replicas, chosen uniformly at random per request
(a 64-bit mix of its index, so runs are reproducible), like a Service spreading connections;
its :class:`Outcome` records which. That replica asks its own :class:`RoutingPolicy` instance
(the same objects the HTTP router runs, through :mod:`prefixserving.router.policies.base`) for
a backend, giving it the request's chained block keys, the Ready replicas and their loads:
that router's own in-flight counts (exact) plus ``waiting`` and ``kv_usage`` as last scraped
(every ``scrape_interval_s``). With ``kv_events`` the context also carries ``cached``: per
replica, the request's leading blocks that replica's KV cache events say it holds, delivered
``kv_event_lag_s`` after the cache changed (:mod:`.kv_events`; every router replica sees the
same events). Router replicas share nothing else, as in production. The replica queues
the request and serves it (:mod:`.replica`): TTFT is the time from arrival to the end of its
prefill. It also records the most of the request's prompt any Ready replica held when it was
routed (``fleet_hit_tokens``), so a fault's extra misses split into what the fleet no longer
held and what went to the wrong replica.

A router replica can restart (:meth:`ClusterSim.restart_router`: its policy state is lost).
Membership changes over time: :meth:`ClusterSim.add_replica` starts a replica (cold, or warmed
with given prefixes) that takes traffic after ``ready_delay_s``; :meth:`remove_replica` stops
routing to one, which then drains. Every ``tick_s`` a :class:`Tick` of per-replica signals
(in-flight, waiting, running, KV usage, cached blocks, running totals) is recorded and passed
to ``on_tick``, which may add or remove replicas: autoscalers and rollouts plug in there.
Requests that arrive while no replica is Ready wait at the router.

Events at the same instant run in this order: membership, completions, scrapes, arrivals,
ticks. Everything is deterministic: the same inputs give the same result.

Cost: O(log E) per event plus the policy's and the replica's per-request cost, and
O(N x blocks) per routed request for ``fleet_hit_tokens`` (N Ready replicas).
"""

from __future__ import annotations

import enum
import heapq
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from prefixserving.router.policies.base import (
    BackendLoad,
    Decision,
    RoutingContext,
    RoutingPolicy,
)
from prefixserving.router.policies.ranking import mix64
from prefixserving_lab.models.kv_events import KvEventIndex
from prefixserving_lab.models.replica import Job, Replica, ReplicaStats, ServiceModel
from prefixserving_lab.stats import quantile
from prefixserving_lab.workloads.blocks import chain_block_ids
from prefixserving_lab.workloads.traces import TraceRequest

# A subscriber's delay from an engine's cache change to the router's index, in simulated
# seconds (a ZMQ subscriber on the cluster network takes about a millisecond; 10 ms is generous).
KV_EVENT_LAG_S = 0.01


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """Replica model and the router's view of load and, with ``kv_events``, of the caches
    (each cache change reaches the routers ``kv_event_lag_s`` later)."""

    service: ServiceModel = field(default_factory=ServiceModel)
    scrape_interval_s: float = 1.0
    tick_s: float = 1.0
    kv_events: bool = False
    kv_event_lag_s: float = KV_EVENT_LAG_S

    def __post_init__(self) -> None:
        if self.scrape_interval_s <= 0 or self.tick_s <= 0:
            raise ValueError("scrape_interval_s and tick_s must be > 0")
        if self.kv_event_lag_s < 0:
            raise ValueError("kv_event_lag_s must be >= 0")


@dataclass(frozen=True, slots=True)
class ReplicaSample:
    """One replica at one tick. Totals (``routed`` ...) count from the replica's start."""

    name: str
    ready: bool
    draining: bool
    in_flight: int
    waiting: int
    running: int
    kv_usage: float
    cached_blocks: int
    routed: int
    input_tokens: int
    hit_tokens: int
    prefill_busy_s: float
    uncached_waiting_tokens: int


@dataclass(frozen=True, slots=True)
class Tick:
    """Signals at ``time_s``; ``pending``: requests waiting at the router for any replica."""

    time_s: float
    pending: int
    replicas: tuple[ReplicaSample, ...]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What happened to one request (``ttft_s`` is ``None`` if it was never served;
    ``router``: the index of the router replica that routed it, ``None`` if none did;
    ``fleet_hit_tokens``: the most of its prompt any Ready replica held cached when it was
    routed, what the best placement would have hit had nothing been evicted before it
    started)."""

    index: int
    arrival_s: float
    backend: str | None
    reason: str | None
    ttft_s: float | None
    hit_tokens: int
    input_tokens: int
    router: int | None = None
    fleet_hit_tokens: int = 0


@dataclass(slots=True)
class ClusterResult:
    """Per-request outcomes, per-replica totals and the tick series of one run."""

    outcomes: list[Outcome]
    replicas: dict[str, ReplicaStats]
    ticks: list[Tick]
    decisions: Counter[str]
    end_s: float

    @property
    def hit_rate(self) -> float:
        total = sum(o.input_tokens for o in self.outcomes if o.ttft_s is not None)
        return sum(o.hit_tokens for o in self.outcomes) / total if total else 0.0

    def ttft_quantile(self, q: float) -> float:
        """TTFT quantile over served requests (:func:`prefixserving_lab.stats.quantile`); NaN
        if none was served."""
        return quantile((o.ttft_s for o in self.outcomes if o.ttft_s is not None), q)

    def max_mean(self, attribute: str = "routed") -> float:
        """Largest per-replica total of ``attribute`` over the mean (1.0 = perfectly even)."""
        values = [getattr(s, attribute) for s in self.replicas.values()]
        mean = sum(values) / len(values) if values else 0.0
        return max(values) / mean if mean else 1.0


def hit_rate(outcomes: Sequence[Outcome]) -> float:
    """Cached prompt tokens over prompt tokens of ``outcomes``; NaN for none."""
    total = sum(o.input_tokens for o in outcomes)
    return sum(o.hit_tokens for o in outcomes) / total if total else float("nan")


class _Kind(enum.IntEnum):
    MEMBERSHIP = 0
    PREFILL_DONE = 1
    DECODE_DONE = 2
    SCRAPE = 3
    ARRIVAL = 4
    TICK = 5


class ClusterSim:
    """A router, its policy and a changing set of replicas (see the module docstring)."""

    def __init__(
        self,
        policy: RoutingPolicy | Sequence[RoutingPolicy],
        config: ClusterConfig | None = None,
        on_tick: Callable[[ClusterSim, Tick], None] | None = None,
    ) -> None:
        """``policy``: one policy (one router) or one fresh instance per router replica."""
        self.routers = [policy] if isinstance(policy, RoutingPolicy) else list(policy)
        if not self.routers:
            raise ValueError("at least one router policy is needed")
        self.config = config or ClusterConfig()
        self.on_tick = on_tick
        self.now = 0.0
        self.replicas: dict[str, Replica] = {}
        self._retired: dict[str, ReplicaStats] = {}
        self._events: list[tuple[float, int, int, object]] = []
        self._seq = 0
        self._in_flight: list[Counter[str]] = [Counter() for _ in self.routers]
        self._generation = [0 for _ in self.routers]
        self._scraped: dict[str, BackendLoad] = {}
        self._pending: deque[Job] = deque()
        self._decisions: Counter[str] = Counter()
        self._outcomes: dict[int, Outcome] = {}
        self._routes: dict[int, tuple[int, int, Decision]] = {}
        self._ticks: list[Tick] = []
        self.identities: dict[str, str] = {}
        """Routing identity per replica (``RoutingContext.identities``); none: its name."""
        self._kv = (
            KvEventIndex(lambda: self.now, self.config.kv_event_lag_s)
            if self.config.kv_events
            else None
        )

    # -- membership ------------------------------------------------------------------------

    def add_replica(
        self,
        name: str,
        *,
        at_s: float | None = None,
        ready_delay_s: float = 0.0,
        warm: Sequence[tuple[int, ...]] = (),
        service: ServiceModel | None = None,
        identity: str | None = None,
    ) -> None:
        """Start replica ``name`` at ``at_s`` (default: now); it takes traffic
        ``ready_delay_s`` later. ``warm``: chained block keys to pre-load into its cache.
        ``identity``: the routing identity its warm-up sidecar reports (the routers rank it by
        that, from its first request)."""
        model = service or self.config.service
        if identity is not None:
            self.identities[name] = identity
        self._push(self._at(at_s), _Kind.MEMBERSHIP, ("add", name, ready_delay_s, warm, model))

    def remove_replica(self, name: str, *, at_s: float | None = None) -> None:
        """Stop routing to ``name`` at ``at_s`` (default: now); it finishes what it holds."""
        self._push(self._at(at_s), _Kind.MEMBERSHIP, ("remove", name))

    def restart_router(self, index: int, policy: RoutingPolicy) -> None:
        """Router replica ``index`` restarts now with ``policy`` (fresh state) and counts no
        requests in flight; the requests it routed before finish on their engines."""
        if not 0 <= index < len(self.routers):
            raise ValueError(f"no router replica {index}; there are {len(self.routers)}")
        self.routers[index] = policy
        self._in_flight[index] = Counter()
        self._generation[index] += 1

    def ready_backends(self) -> tuple[str, ...]:
        return tuple(sorted(n for n, r in self.replicas.items() if r.ready and not r.draining))

    def cached(self, blocks: tuple[int, ...], backends: Sequence[str]) -> dict[str, int]:
        """``RoutingContext.cached`` for ``blocks`` as the routers see it now (empty without
        ``kv_events``)."""
        return self._kv.cached(blocks, backends) if self._kv is not None else {}

    def _at(self, at_s: float | None) -> float:
        if at_s is None:
            return self.now
        if at_s < self.now:
            raise ValueError(f"cannot schedule at {at_s} s, the simulation is at {self.now} s")
        return at_s

    def _membership(self, payload: tuple) -> None:
        action, name = payload[0], payload[1]
        if action == "add":
            _, _, ready_delay_s, warm, model = payload
            if name in self.replicas:
                raise ValueError(f"replica {name!r} already exists")
            listener = self._kv.listener(name) if self._kv is not None else None
            replica = Replica.create(name, model, listener)
            for blocks in warm:
                replica.cache.warm(blocks)
            self.replicas[name] = replica
            self._push(self.now + ready_delay_s, _Kind.MEMBERSHIP, ("ready", name))
        elif action == "ready":
            replica = self.replicas.get(name)
            if replica is not None and not replica.draining:
                replica.ready = True
                self._flush_pending()
        elif action == "remove":
            replica = self.replicas.get(name)
            if replica is None:
                raise ValueError(f"no replica {name!r} to remove")
            replica.draining = True
            self._retire_if_drained(replica)

    def _retire_if_drained(self, replica: Replica) -> None:
        if replica.draining and replica.idle:
            self._retired[replica.name] = replica.stats
            del self.replicas[replica.name]
            self._scraped.pop(replica.name, None)
            if self._kv is not None:
                self._kv.forget(replica.name)

    # -- the run ---------------------------------------------------------------------------

    def run(self, requests: Sequence[TraceRequest], until_s: float | None = None) -> ClusterResult:
        """Replay ``requests`` (sorted by arrival) until every request finished, or until
        ``until_s``, or until requests wait at the router with no replica to come (no Ready
        replica, no membership change scheduled and no ``on_tick`` to add one)."""
        self._requests = requests
        self._remaining = len(requests)
        if requests:
            self._push(requests[0].arrival_s, _Kind.ARRIVAL, 0)
        self._push(0.0, _Kind.SCRAPE, None)
        self._push(0.0, _Kind.TICK, None)
        handlers = {
            _Kind.MEMBERSHIP: self._membership,
            _Kind.PREFILL_DONE: self._prefill_done,
            _Kind.DECODE_DONE: self._decode_done,
            _Kind.SCRAPE: self._scrape,
            _Kind.ARRIVAL: self._arrival,
            _Kind.TICK: self._tick,
        }
        while self._events and self._remaining and not self._stuck():
            time_s, kind, _, payload = heapq.heappop(self._events)
            if until_s is not None and time_s > until_s:
                break
            self.now = time_s
            handlers[_Kind(kind)](payload)  # type: ignore[operator]
        outcomes = [
            self._outcomes.get(i, Outcome(i, r.arrival_s, None, None, None, 0, r.input_tokens))
            for i, r in enumerate(requests)
        ]
        stats = {**self._retired, **{n: r.stats for n, r in self.replicas.items()}}
        return ClusterResult(outcomes, stats, self._ticks, self._decisions, self.now)

    def _stuck(self) -> bool:
        if not self._pending or self.ready_backends() or self.on_tick is not None:
            return False
        return not any(e[1] == _Kind.MEMBERSHIP for e in self._events)

    def _push(self, time_s: float, kind: _Kind, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._events, (time_s, int(kind), self._seq, payload))

    def _arrival(self, index: object) -> None:
        assert isinstance(index, int)
        request = self._requests[index]
        if index + 1 < len(self._requests):
            self._push(self._requests[index + 1].arrival_s, _Kind.ARRIVAL, index + 1)
        job = Job(
            index,
            request.arrival_s,
            chain_block_ids(request.block_ids),
            request.input_tokens,
            request.output_tokens,
        )
        if self.ready_backends():
            self._route(job)
        else:
            self._pending.append(job)

    def _flush_pending(self) -> None:
        while self._pending and self.ready_backends():
            self._route(self._pending.popleft())

    def router_of(self, index: int) -> int:
        """The router replica that request ``index`` arrives at (uniform over replicas)."""
        return mix64(index) % len(self.routers)

    def _route(self, job: Job) -> None:
        router = self.router_of(job.index)
        policy, in_flight = self.routers[router], self._in_flight[router]
        backends = self.ready_backends()
        idle = BackendLoad()
        loads = {
            b: BackendLoad(
                in_flight[b],
                self._scraped.get(b, idle).waiting,
                self._scraped.get(b, idle).kv_usage,
                self._scraped.get(b, idle).running,
            )
            for b in backends
        }
        job.fleet_hit_tokens = max(self.replicas[b].hit_tokens(job) for b in backends)
        cached = self.cached(job.blocks, backends)
        ctx = RoutingContext(job.blocks, backends, loads, cached, self.identities)
        decision = policy.select(ctx)
        if decision.backend not in backends:
            raise ValueError(f"policy {policy.name} chose {decision.backend}, not a Ready replica")
        policy.on_routed(ctx, decision)
        self._routes[job.index] = (router, self._generation[router], decision)
        self._decisions[str(decision.reason)] += 1
        in_flight[decision.backend] += 1
        replica = self.replicas[decision.backend]
        replica.stats.routed += 1
        replica.queue.append(job)
        self._start(replica)

    def _start(self, replica: Replica) -> None:
        started = replica.try_start()
        if started is not None:
            job, duration = started
            self._push(self.now + duration, _Kind.PREFILL_DONE, (replica.name, job))

    def _prefill_done(self, payload: object) -> None:
        name, job = payload  # type: ignore[misc]
        replica = self.replicas[name]
        replica.prefilling = False
        router, _, decision = self._routes[job.index]
        self._outcomes[job.index] = Outcome(
            job.index,
            job.arrival_s,
            name,
            str(decision.reason),
            self.now - job.arrival_s,
            job.hit_tokens,
            job.input_tokens,
            router,
            job.fleet_hit_tokens,
        )
        decode_s = job.output_tokens * replica.model.decode_s_per_token
        self._push(self.now + decode_s, _Kind.DECODE_DONE, (name, job))
        self._start(replica)

    def _decode_done(self, payload: object) -> None:
        name, job = payload  # type: ignore[misc]
        replica = self.replicas[name]
        replica.finish(job)
        router, generation, _ = self._routes.pop(job.index)
        if generation == self._generation[router]:
            self._in_flight[router][name] -= 1
        self._remaining -= 1
        self._start(replica)
        self._retire_if_drained(replica)

    def _scrape(self, _: object) -> None:
        self._scraped = {
            n: BackendLoad(0, float(len(r.queue)), r.cache.kv_usage, float(r.running))
            for n, r in self.replicas.items()
        }
        if self._remaining:
            self._push(self.now + self.config.scrape_interval_s, _Kind.SCRAPE, None)

    def _tick(self, _: object) -> None:
        samples = tuple(
            ReplicaSample(
                n,
                r.ready,
                r.draining,
                sum(c[n] for c in self._in_flight),
                len(r.queue),
                r.running,
                r.cache.kv_usage,
                r.cache.cached,
                r.stats.routed,
                r.stats.input_tokens,
                r.stats.hit_tokens,
                r.stats.prefill_busy_s,
                r.uncached_waiting_tokens(),
            )
            for n, r in sorted(self.replicas.items())
        )
        tick = Tick(self.now, len(self._pending), samples)
        self._ticks.append(tick)
        if self.on_tick is not None:
            self.on_tick(self, tick)
        if self._remaining:
            self._push(self.now + self.config.tick_s, _Kind.TICK, None)
