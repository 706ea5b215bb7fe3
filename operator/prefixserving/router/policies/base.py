"""The routing-policy interface shared by the router and the cluster simulator.

A policy sees one frozen :class:`RoutingContext` per request (the request's prefix block
hashes, the healthy backends, their loads) and returns a :class:`Decision`. Policies never hash
request bodies themselves (``router.prefix_hashing`` does) and never do I/O, so the HTTP router and the
simulator run exactly the same code.

Determinism: every policy must give the same decision for the same context and the same
sequence of earlier contexts, with no randomness and no process-specific hashing (never
Python's ``hash()`` on strings, which is salted per process). This is what lets two router
replicas agree without talking to each other.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, NamedTuple


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
    FALLBACK = "fallback"  # no backend within the bound: the least-loaded one
    BALANCE = "balance"  # a policy with no affinity (round-robin, least-loaded)


class Decision(NamedTuple):
    backend: str
    reason: DecisionReason


@dataclass(frozen=True, slots=True)
class RoutingContext:
    """Everything a policy may look at for one request.

    ``blocks``: chained hashes of the request's leading fixed-size content blocks, first block
    first (an empty tuple for an empty prompt). ``backends``: healthy backend ids, sorted.
    ``loads``: load per backend id (a missing id means an idle backend).
    """

    blocks: tuple[int, ...]
    backends: tuple[str, ...]
    loads: Mapping[str, BackendLoad] = field(default_factory=dict)


class RoutingPolicy:
    """Base class of every routing policy.

    Subclasses set ``name`` (the registry key and metric label) and implement :meth:`select`;
    policies with prefix affinity also implement :meth:`rank`, which the hot-prefix endpoint
    uses to tell a new member which prefixes it would own.
    """

    name: ClassVar[str]

    def select(self, ctx: RoutingContext) -> Decision:
        raise NotImplementedError

    def rank(self, blocks: tuple[int, ...], backends: Sequence[str]) -> list[str]:
        """Backends in order of preference for these blocks, ignoring load."""
        return list(backends)

    def on_routed(self, ctx: RoutingContext, decision: Decision) -> None:
        """Called after a request was sent to ``decision.backend``."""

    def on_complete(self, backend: str) -> None:
        """Called when a request to ``backend`` finished (any outcome)."""
