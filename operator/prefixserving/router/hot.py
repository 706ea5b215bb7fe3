"""Hot prefixes: the prefixes with the most recent traffic, each with a replayable request.

The warm-up sidecar of a new engine replica asks the router which prefixes the replica will
own once it joins, and sends those requests to it before it takes traffic.

**Endpoint** (served by ``router.app``)::

    GET /v1/prefixserving/hot-prefixes?member=http://10.0.0.7:8000&limit=32

- ``member`` (optional): the new replica's base URL, written as the router writes backends
  (``http://IP:PORT``). With it, only the prefixes the routing policy would send to
  ``member`` among the current healthy backends plus ``member``, all idle
  (``policies.base.home``: the policy's own ``select``, which counts nothing); without it,
  all hot prefixes.
- ``replaces`` (optional, with ``member``): the backend ``member`` replaces in a rolling
  update (``warmup.handover``). The ranking is then among the healthy backends without
  ``replaces`` plus ``member``, ``member`` ranks by ``replaces``' routing identity when the
  router knows one (it inherits it with the handover; a router without ``--identity-port``
  ranks every backend by its URL), and when the router follows the engines' KV cache
  events, what ``replaces`` holds counts as ``member``'s (``policies.base.home_after_join``):
  the answer holds the prefixes the router will send to ``member`` once it has replayed them
  and ``replaces`` is gone, so the replaced pod's cache moves to its successor.
- ``limit`` (optional, default 32, at most 1024): the most prefixes returned.

Answer, ``200 application/json``, hottest first::

    {"member": "http://10.0.0.7:8000" | null,
     "replaces": "http://10.0.0.4:8000" | null,
     "backends": ["http://10.0.0.5:8000", ...],          # healthy backends used for ranking
     "prefixes": [{"kind": "chat" | "completion",
                   "body": {...},                        # POST it to /v1/chat/completions or
                                                         # /v1/completions (add max_tokens)
                   "hits": 17,                           # decayed recent request count
                   "blocks": 6}]}                        # prefix depth in key blocks

``body`` holds ``model`` and the leading content only (chat: ``tools`` and ``messages`` cut
at the prefix boundary, as clients send them; completions: ``prompt`` as text or token ids
cut at the boundary), no sampling parameters. A policy without affinity (round-robin,
least-loaded) places no prefix, so a new member owns none of them. ``400`` for a bad
``limit`` or ``replaces`` without ``member``.

**Algorithm**: every block of every request key is counted (a request counts for each of its
prefixes). Counts are space-saving counters (Metwally et al.) over at most ``capacity``
prefixes: a new prefix arriving at a full table replaces the smallest counter and inherits
its count as an error bound. Counts decay exponentially with half-life ``half_life_s``:
request ``t`` adds ``2 ** (t / half_life_s)``, so older weight shrinks relative to newer
without touching every counter; weights are rescaled before they overflow. A min-heap with
lazy deletion finds the smallest counter.

Answering: a prefix is *shared* when its guaranteed count (count minus error) is at least
``min_hits``. Shared prefixes are taken hottest first, at most ``limit`` of them; a prefix
whose descendant is already chosen is skipped, and a chosen prefix is replaced by a shared
descendant (replaying the deeper one warms its ancestors too; this never takes a new slot).
So a system prompt behind hundreds of requests is chosen before a conversation seen twice
under another prompt, and is replayed through the deepest shared prefix under it.

Requests with ``cache_salt`` are never recorded: the salt isolates a tenant's cache and
must not be served to anyone. A prefix whose replay body the answer cannot carry
(:func:`servable`: NaN, a lone surrogate or deep nesting in a message field the key never
reads; the router forwards such bodies unchanged and the engine judges them) is dropped from
the table when an answer would list it, so one such request cannot break the endpoint for
every warm-up, and the next request with that prefix records a body that can be replayed.
The check runs when answering (warm-ups ask rarely), never on the request path.

**Parameters**: ``capacity`` (1024 prefixes), ``half_life_s`` (300 s), ``min_hits`` (1.5:
seen at least twice recently; decay makes two hits worth a little under 2).

**Cost**: O(``prefix_blocks * log capacity``) per request; memory O(``capacity``), each
prefix holding its block chain and a replay body trimmed to the key's depth (about
``block_chars * prefix_blocks`` characters, shared by the prefixes of one request), and with
engine events the source request's engine block keys (shared too). An answer with
``member`` costs one policy ``select`` per shared prefix it considers, plus, with events, one
O(depth) index lookup per backend for each source request among them.
"""

from __future__ import annotations

import heapq
import json
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from prefixserving.router.policies.base import RoutingPolicy, home_after_join
from prefixserving.router.policies.ranking import NO_IDENTITIES
from prefixserving.router.prefix_hashing import (
    ContentKind,
    KeyConfig,
    PrefixKey,
    nests_deeper_than,
    replay_body,
)

DEFAULT_LIMIT = 32
MAX_LIMIT = 1024
# Deepest nesting of a replay body in the answer (its JSON encoder recurses once per level).
MAX_REPLAY_DEPTH = 32
_RESCALE_EXPONENT = 64.0
T = TypeVar("T")


def servable(body: dict[str, Any]) -> bool:
    """Whether the answer can carry ``body`` (parsed JSON): objects and lists nested at most
    ``MAX_REPLAY_DEPTH`` levels (checked without recursion), and strict JSON in UTF-8: no NaN
    or infinity, no lone surrogate (the JSON answer refuses both). Cost: O(size of body)."""
    if nests_deeper_than(body, MAX_REPLAY_DEPTH):
        return False
    try:
        json.dumps(body, ensure_ascii=False, allow_nan=False).encode()
    except ValueError:  # NaN or infinity; UnicodeEncodeError for a lone surrogate
        return False
    return True


def choose_prefixes(
    candidates: Iterable[T],
    chain_of: Callable[[T], tuple[int, ...]],
    limit: int,
    wanted: Callable[[T], bool] = lambda _: True,
) -> list[T]:
    """Up to ``limit`` of the wanted ``candidates`` (best first, each with its block chain),
    none an ancestor of another: a candidate whose descendant is already chosen is skipped,
    and a chosen one is replaced by a wanted descendant (replaying the deeper prefix warms its
    ancestors too; this never takes a new slot). Order of choice kept. Cost: O(total chain
    length) set operations plus one ``wanted`` per candidate not already covered."""
    chosen: dict[int, T] = {}  # last block -> candidate, in order of choice
    covered: set[int] = set()  # ancestors of chosen prefixes
    for candidate in candidates:
        chain = chain_of(candidate)
        if chain[-1] in covered or not wanted(candidate):
            continue
        deepens = any(ancestor in chosen for ancestor in chain[:-1])
        if len(chosen) >= limit and not deepens:
            continue
        for ancestor in chain[:-1]:
            covered.add(ancestor)
            chosen.pop(ancestor, None)
        chosen[chain[-1]] = candidate
    return list(chosen.values())


@dataclass(slots=True)
class _Entry:
    chain: tuple[int, ...]
    key: PrefixKey
    source: dict[str, Any]
    engine_keys: tuple[int, ...]
    count: float
    error: float


@dataclass(frozen=True, slots=True)
class HotPrefix:
    """One answer row: ``kind`` is ``chat`` or ``completion``."""

    kind: str
    body: dict[str, Any]
    hits: int
    blocks: int

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "body": self.body, "hits": self.hits, "blocks": self.blocks}


class HotPrefixes:
    """Top prefixes by decayed recent traffic, bounded to ``capacity`` entries."""

    def __init__(
        self,
        key_config: KeyConfig,
        *,
        capacity: int = 1024,
        half_life_s: float = 300.0,
        min_hits: float = 1.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.key_config = key_config
        self.capacity = capacity
        self.half_life_s = half_life_s
        self.min_hits = min_hits
        self._clock = clock
        self._origin = clock()
        self._entries: dict[int, _Entry] = {}
        self._heap: list[tuple[float, int]] = []

    def __len__(self) -> int:
        return len(self._entries)

    def _weight(self) -> float:
        exponent = (self._clock() - self._origin) / self.half_life_s
        if exponent > _RESCALE_EXPONENT:
            self._rescale(2.0**-exponent)
            return 1.0
        return 2.0**exponent

    def _rescale(self, factor: float) -> None:
        self._origin = self._clock()
        for entry in self._entries.values():
            entry.count *= factor
            entry.error *= factor
        self._heap = [(e.count, h) for h, e in self._entries.items()]
        heapq.heapify(self._heap)

    def _pop_smallest(self) -> float:
        while True:
            count, block = heapq.heappop(self._heap)
            entry = self._entries.get(block)
            if entry is not None and entry.count == count:
                del self._entries[block]
                return count

    def observe(
        self, key: PrefixKey, body: Mapping[str, Any], engine_keys: tuple[int, ...] = ()
    ) -> None:
        """Count every prefix of ``key``; ``body`` is the parsed request it came from and
        ``engine_keys`` its engine block keys (``kv_events.lookup``; empty without events)."""
        if key.salted or not key.blocks:
            return
        weight = self._weight()
        source: dict[str, Any] | None = None
        for depth, block in enumerate(key.blocks, start=1):
            entry = self._entries.get(block)
            if entry is None:
                floor = self._pop_smallest() if len(self._entries) >= self.capacity else 0.0
                if source is None:
                    source = replay_body(body, key, len(key.blocks), self.key_config)
                entry = _Entry(key.blocks[:depth], key, source, engine_keys, floor + weight, floor)
                self._entries[block] = entry
            else:
                entry.count += weight
            heapq.heappush(self._heap, (entry.count, block))
        if len(self._heap) > 4 * self.capacity:
            self._heap = [(e.count, h) for h, e in self._entries.items()]
            heapq.heapify(self._heap)

    def _scale(self) -> float:
        return 2.0 ** (-(self._clock() - self._origin) / self.half_life_s)

    def _choose(
        self, scale: float, limit: int, wanted: Callable[[_Entry], bool] = lambda _: True
    ) -> list[_Entry]:
        """Up to ``limit`` wanted shared prefixes, none an ancestor of another
        (:func:`choose_prefixes`, hottest first). Cost: O(n log n) for the n table entries (at
        most ``capacity``), plus :func:`servable` of each distinct replay body of a shared
        entry."""
        shared = sorted(self._servable_shared(scale), key=lambda e: (-(e.count - e.error), e.chain))
        return choose_prefixes(shared, lambda e: e.chain, limit, wanted)

    def _servable_shared(self, scale: float) -> list[_Entry]:
        """The shared entries whose replay body the answer can carry; drops the others."""
        verdicts: dict[int, bool] = {}  # id of a replay body (shared by one request's prefixes)
        shared = []
        for block, entry in list(self._entries.items()):
            if (entry.count - entry.error) * scale < self.min_hits:
                continue
            source = id(entry.source)
            if source not in verdicts:
                verdicts[source] = servable(entry.source)
            if verdicts[source]:
                shared.append(entry)
            else:
                del self._entries[block]  # its heap item goes stale; _pop_smallest skips it
        return shared

    def top(self, limit: int = DEFAULT_LIMIT) -> list[HotPrefix]:
        """The hottest shared prefixes, each replayed through its deepest chosen descendant."""
        scale = self._scale()
        return [self._row(entry, scale) for entry in self._choose(scale, limit)]

    def owned_by(
        self,
        member: str,
        backends: Sequence[str],
        policy: RoutingPolicy,
        limit: int = DEFAULT_LIMIT,
        *,
        replaces: str | None = None,
        cached: Callable[[tuple[int, ...], Sequence[str]], Mapping[str, int]] | None = None,
        identities: Mapping[str, str] = NO_IDENTITIES,
    ) -> list[HotPrefix]:
        """Hot prefixes that ``policy`` sends to ``member`` once it joins ``backends``, all of
        them idle, and, with ``replaces``, takes over what that backend's cache holds while it
        leaves (``policies.base.home_after_join``); none for a policy without affinity.
        ``cached``: the engines' cached depth of a prefix's source request, from its engine
        block keys (the router's ``kv_events.index``; None without events), looked up once
        per source request: the prefixes of one request share its engine keys.
        ``identities``: the backends' routing identities (``RoutingContext.identities``);
        ``member`` takes ``replaces``' identity when it has one."""
        scale = self._scale()
        depths_of: dict[int, Mapping[str, int]] = {}  # id of an entry's engine keys -> depths

        def owns(entry: _Entry) -> bool:
            depths = None
            if cached is not None:
                keys = id(entry.engine_keys)
                if keys not in depths_of:
                    depths_of[keys] = cached(entry.engine_keys, backends)
                depths = depths_of[keys]
            after = home_after_join(
                policy, entry.chain, backends, member, replaces, depths, identities
            )
            return after == member

        return [self._row(entry, scale) for entry in self._choose(scale, limit, owns)]

    def _row(self, entry: _Entry, scale: float) -> HotPrefix:
        depth = len(entry.chain)
        body = replay_body(entry.source, entry.key, depth, self.key_config)
        kind = "chat" if entry.key.kind is ContentKind.CHAT else "completion"
        hits = math.floor((entry.count - entry.error) * scale + 0.5)
        return HotPrefix(kind, body, hits, depth)
