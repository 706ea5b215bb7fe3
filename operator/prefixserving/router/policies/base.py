"""The routing-policy interface shared by the router and the cluster simulator.

A policy sees one frozen :class:`RoutingContext` per request (the request's prefix block
hashes, the healthy backends, their loads) and returns a :class:`Decision`: the backend, why,
and the ordered fallbacks a retry walks. Policies never hash request bodies themselves
(``router.prefix_hashing`` does) and never do I/O, so the HTTP router and the simulator run
exactly the same code.

Two calls per request, in this order (:func:`route`): :meth:`RoutingPolicy.select` decides and
changes no state (so the hot-prefix endpoint can ask where a prefix would go, :func:`home`);
:meth:`RoutingPolicy.on_routed` then does the policy's upkeep for the routed request (counts,
remembered backends, rotation), once per request, never for a retry: "producers compute,
scorers read" (llm-d). When a gateway's retry lands the request on a fallback, the endpoint
picker reports it with :meth:`RoutingPolicy.on_served`.

Determinism: every policy must give the same decision for the same context and the same
sequence of earlier routed contexts, with no randomness and no process-specific hashing
(never Python's ``hash()`` on strings, which is salted per process). This is what lets two
router replicas agree without talking to each other.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, NamedTuple

from prefixserving.router.policies.ranking import NO_IDENTITIES


@dataclass(frozen=True, slots=True)
class BackendLoad:
    """What the router knows about one backend's load.

    ``in_flight``: requests this router has sent and not finished. ``waiting``: the engine's
    ``vllm:num_requests_waiting`` at the last scrape. ``kv_usage``: ``vllm:kv_cache_usage_perc``
    (0..1) at the last scrape. ``running``: ``vllm:num_requests_running`` at the last scrape
    (with ``waiting``, every router's requests on that engine).
    """

    in_flight: int = 0
    waiting: float = 0.0
    kv_usage: float = 0.0
    running: float = 0.0


class DecisionReason(enum.StrEnum):
    """Why a backend was chosen; exported as the ``decision`` label of the router's metrics."""

    AFFINITY = "affinity"  # the backend the prefix ranks first
    SPILLED = "spilled"  # a lower-ranked backend, the better ones being over the load bound
    # a backend whose KV cache events show it holds more of the request's prefix than any
    # other backend within the load bound, where the ranking preferred another one
    CACHED = "cached"
    FALLBACK = "fallback"  # no backend within the bound: the least-loaded one
    # no preference by prefix: a policy without affinity, a request without blocks, (in
    # two_choice) a key with no recorded backend among its candidates, or (prefix_affinity
    # with engine events) a request no engine holds more of than the others, placed by load
    BALANCE = "balance"


class Decision(NamedTuple):
    """One routing decision: ``backend``, ``reason``, ``fallbacks``, the backends a retry
    goes to, best first (empty: no retry), and ``key``, the block hash the policy ranked by
    (None: no prefix involved)."""

    backend: str
    reason: DecisionReason
    fallbacks: tuple[str, ...] = ()
    key: int | None = None

    @property
    def candidates(self) -> tuple[str, ...]:
        """``backend`` followed by the fallbacks: the order the proxy tries them in."""
        return (self.backend, *self.fallbacks)


@dataclass(frozen=True, slots=True)
class RoutingContext:
    """Everything a policy may look at for one request.

    ``blocks``: chained hashes of the request's leading fixed-size content blocks, first block
    first (an empty tuple for an empty prompt). ``backends``: healthy backend ids, sorted.
    ``loads``: load per backend id (a missing id means an idle backend). ``cached``: per
    backend id, how many of the request's leading engine blocks that engine reports holding
    (from its KV cache events); empty when the router does not follow the engines' events.
    A router that follows them lists every engine it follows, 0 for one holding none of the
    request, so that a request no engine holds is told apart from the mode being off; an
    id missing from a non-empty mapping holds none. The counts are in the engine's blocks
    (``block_size`` tokens), not in ``blocks``: compare them across backends only.
    ``identities``: per backend id, the routing identity a rendezvous ranking hashes
    (``policies.ranking``); a backend missing from it is ranked by its id. An engine pod that
    replaced another in a rolling update carries that pod's identity, and so its place.
    """

    blocks: tuple[int, ...]
    backends: tuple[str, ...]
    loads: Mapping[str, BackendLoad] = field(default_factory=dict)
    cached: Mapping[str, int] = field(default_factory=dict)
    identities: Mapping[str, str] = field(default_factory=dict)


class RoutingPolicy:
    """Base class of every routing policy.

    Subclasses set ``name`` (the registry key and metric label) and ``affinity`` (whether
    the policy places a prefix on a backend of its own: the warm-up sidecar of a new backend
    asks which prefixes it would get, and a policy without affinity gives none), implement
    :meth:`select`, and override :meth:`on_routed` when they keep state.
    """

    name: ClassVar[str]
    affinity: ClassVar[bool] = False

    def select(self, ctx: RoutingContext) -> Decision:
        """The decision for ``ctx``. Changes no state: calling it again gives the same
        decision. ``ctx.backends`` must be non-empty (``ValueError`` otherwise)."""
        raise NotImplementedError

    def on_routed(self, ctx: RoutingContext, decision: Decision) -> None:
        """Called once after :meth:`select` for a request that is routed by ``decision``: the
        policy's upkeep (the default keeps no state)."""

    def on_served(self, decision: Decision, served: str) -> None:
        """Called when a request routed by ``decision`` was served by ``served``, one of its
        fallbacks (a retry by the gateway in front of an endpoint picker), after
        :meth:`on_routed`: what the policy remembers per backend follows the backend that
        holds the prefix now (the default remembers nothing per backend)."""


def route(policy: RoutingPolicy, ctx: RoutingContext) -> Decision:
    """Decide for one request and let the policy record it: what the router does per request."""
    decision = policy.select(ctx)
    policy.on_routed(ctx, decision)
    return decision


def home(
    policy: RoutingPolicy,
    blocks: tuple[int, ...],
    backends: Sequence[str],
    cached: Mapping[str, int] | None = None,
    identities: Mapping[str, str] = NO_IDENTITIES,
) -> str | None:
    """The backend ``policy`` sends a request with ``blocks`` to when every one of
    ``backends`` is idle (``cached`` and ``identities`` as in :class:`RoutingContext`), or
    None when the policy has no affinity. Records nothing; cost: one
    :meth:`~RoutingPolicy.select`."""
    if not policy.affinity:
        return None
    ctx = RoutingContext(blocks, tuple(sorted(backends)), {}, cached or {}, identities)
    return policy.select(ctx).backend


def home_after_join(
    policy: RoutingPolicy,
    blocks: tuple[int, ...],
    backends: Sequence[str],
    member: str,
    replaces: str | None = None,
    cached: Mapping[str, int] | None = None,
    identities: Mapping[str, str] = NO_IDENTITIES,
) -> str | None:
    """:func:`home` once ``member`` has joined ``backends`` and, with ``replaces``, taken over
    what ``replaces`` holds while ``replaces`` left: the members are ``backends`` without
    ``replaces`` plus ``member``, ``replaces``' cached depth (engine events) counts for
    ``member``, and when ``identities`` has one for ``replaces``, ``member`` ranks by it (the
    routing identity it inherits with the warm-up handover). What a warm-up must replay on a
    new backend for the router to send it the traffic it is meant to take: its share of the
    ranking and, in a rolling update, the pod it replaces' cache. Cost: one
    :meth:`~RoutingPolicy.select`."""
    members = {*backends, member} - ({replaces} if replaces and replaces != member else set())
    after = dict(cached or {})
    if replaces is not None and replaces in after:
        depth = after.pop(replaces)
        after[member] = max(after.get(member, 0), depth)
    if replaces is not None and replaces in identities:
        identities = {**identities, member: identities[replaces]}
    return home(policy, blocks, sorted(members), after, identities)
