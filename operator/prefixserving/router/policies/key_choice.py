"""Key choice: which prefix block a request is ranked by, and over how many backends a hot
prefix spreads.

Hashing the first block sends everything behind a shared system prompt to one backend;
hashing the deepest block splits a conversation whose turns share most of their prompt.
:class:`PrefixKeySelector` picks, per request, the shallowest of its leading blocks whose
recent share of traffic is at most ``hot_share / N`` (N backends): a prefix carrying less
than ``hot_share`` of one backend's fair share stays together on one backend, and a hotter
prefix (a system prompt, a popular document) is split by the blocks that follow it.

A split prefix is spread over only as many backends as it needs: ``homes =
ceil(share / (hot_share / N))``, so that each carries at most the hot threshold of it. A
popular document then lives on 2 or 3 backends (2 or 3 misses) instead of all N, while a
system prompt that every request shares (share 1, ``homes >= N``) is on every backend and
its followers are hashed over all of them.

**Algorithm**

1. Count (:meth:`PrefixKeySelector.observe`, a policy's ``on_routed``, once per routed
   request): for each of the request's first ``max_depth_blocks`` block hashes, add the
   current increment to a count-min sketch (two rows of ``sketch_width`` counters, indexed by
   the low and high halves of the block hash's SplitMix64 mix); add it to the total too.
   The increment grows by ``1 / (1 - 1/window_requests)`` per request, which is an
   exponential decay of all counts with a horizon of ``window_requests`` requests (counts are
   rescaled before they overflow).
2. Key (a read, in ``select``; it changes nothing): the first depth ``d`` whose share
   ``count(block[d]) / max(total, min_requests)`` is at most ``hot_share / N``, with the
   counts as step 1 will leave them for this request (computed without writing them, so the
   read and the later count agree exactly); when every block is hot, the deepest block looked
   at.
3. Homes (:meth:`PrefixKeySelector.choose`): when ``d > 0`` the block above the key is hot,
   and it is spread over ``homes = ceil(share(block[d-1]) / (hot_share / N))`` backends. When
   that is fewer than N, the homes are the first ``homes`` rendezvous choices of the
   shallowest hot block that needs fewer than N (the ``parent``: a document's first block
   rather than its last), and the key picks one of them (:class:`KeyChoice`). Ranking by the
   shallowest such block keeps a document's home first among its homes when it turns hot,
   and makes the homes nested as ``homes`` grows, so a change of estimate moves few keys.
   Whether a block needs fewer than N is judged by ``count / total``, without the
   ``min_requests`` floor: the floor keeps the first requests from all being hot, but here
   it made a prefix in every request (a system prompt) look like it needed a few backends
   for each router's first ``min_requests x hot_share`` requests, R times as long in a fleet
   of R router replicas, which then placed documents on those few.
   The request's ``weight`` is what its key brings to its one backend: ``share(block[d-1]) /
   homes`` when spread, else ``share(block[d])`` less the request's own count. Left in, the
   own count weighs a new conversation ``1 / T`` on a router that counted T requests, so R
   replicas, each counting ``T / R``, gave it R times the weight one router does, disagreed
   on its load bound and spilled more (cluster simulation, 8 router replicas: 97.7% of one
   router's hit rate on the Mooncake trace with the own count, 99.6-100% without;
   ``bench/results/cluster-routers.md``).

The state is a function of the traffic seen, so two routers fed the same requests pick the
same keys; routers fed different samples of the same traffic disagree only on prefixes whose
share sits at the threshold, and those are hot enough to be cached on many backends anyway.
(There is deliberately no hysteresis: it would make such disagreements last.)

**Parameters** (:class:`PrefixKeyParams`)

- ``max_depth_blocks`` (``constants.ROUTER_PREFIX_BLOCKS``, 32): blocks looked at; the same
  constant sets how many blocks the router hashes, so every hashed block can be a key.
- ``hot_share`` (0.5): share of one backend's fair share above which a prefix is split.
- ``window_requests`` (4096): decay horizon of the traffic counts, in requests.
- ``min_requests`` (64): the share's denominator never goes below this, so the first
  requests after a start are not all "hot".
- ``sketch_width`` (16384): counters per sketch row (power of two).

**Complexity**: O(``max_depth_blocks``) per request; memory 2 x ``sketch_width`` floats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prefixserving import constants
from prefixserving.router.policies.ranking import mix64

_RESCALE_AT = 2.0**64


@dataclass(frozen=True, slots=True)
class PrefixKeyParams:
    """Parameters of the key choice (see the module docstring)."""

    max_depth_blocks: int = constants.ROUTER_PREFIX_BLOCKS
    hot_share: float = 0.5
    window_requests: int = 4096
    min_requests: int = 64
    sketch_width: int = 16384

    def __post_init__(self) -> None:
        if self.max_depth_blocks < 1:
            raise ValueError("max_depth_blocks must be at least 1")
        if self.hot_share <= 0:
            raise ValueError("hot_share must be > 0")
        if self.window_requests < 2:
            raise ValueError("window_requests must be at least 2")
        if self.min_requests < 1:
            raise ValueError("min_requests must be at least 1")
        if not 2 <= self.sketch_width <= 1 << 32 or self.sketch_width & (self.sketch_width - 1):
            raise ValueError("sketch_width must be a power of two, at most 2**32")


@dataclass(frozen=True, slots=True)
class KeyChoice:
    """How one request is ranked (see the module docstring).

    ``key``: the block hash the ranking orders by. ``parent``: the shallowest hot block above
    the key that needs fewer than all backends, else ``None``; its rendezvous ranking orders
    the homes. ``homes``: how many backends the hot prefix right above the key is spread over
    (all of them when ``parent`` is ``None``). ``weight``: the recent share of traffic this
    key brings to the one backend it goes to (for an unspread key, counted before this
    request: 0 for a new one).
    """

    key: int
    parent: int | None
    homes: int
    weight: float


class PrefixKeySelector:
    """Decayed block popularity (count-min sketch) and the key choice built on it.

    Reads (:meth:`depth`, :meth:`key`, :meth:`choose`) change nothing and see the counts as
    they will be once the request asked about is counted, so a routed request weighs in its
    own key choice; :meth:`observe` counts it (a policy's ``on_routed``). The slots and the
    shares of the last blocks read are kept (the shares until the next count), so a request
    read, read again and counted is hashed once and its shares computed once.
    """

    def __init__(self, params: PrefixKeyParams) -> None:
        self.params = params
        self._rows = ([0.0] * params.sketch_width, [0.0] * params.sketch_width)
        self._mask = params.sketch_width - 1
        self._growth = 1.0 / (1.0 - 1.0 / params.window_requests)
        self._increment = 1.0
        self._total = 0.0
        self._last_blocks: tuple[int, ...] = ()
        self._last_slots: list[tuple[int, int]] = []
        self._last_read: _Read | None = None  # None: a count happened since

    def _slots(self, blocks: tuple[int, ...]) -> list[tuple[int, int]]:
        """The sketch slots (one per row) of each of the first ``max_depth_blocks`` blocks;
        the last ones computed are reused for the same ``blocks`` object."""
        if blocks is self._last_blocks:
            return self._last_slots
        mask = self._mask
        out = []
        for block in blocks[: self.params.max_depth_blocks]:
            mixed = mix64(block)
            out.append((mixed & mask, (mixed >> 32) & mask))
        self._last_blocks, self._last_slots, self._last_read = blocks, out, None
        return out

    def observe(self, blocks: tuple[int, ...]) -> None:
        """Count one request's leading blocks (the index upkeep after a request is routed)."""
        inc = self._increment
        first, second = self._rows
        for a, b in self._slots(blocks):
            first[a] += inc
            second[b] += inc
        self._total += inc
        self._increment *= self._growth
        if self._increment > _RESCALE_AT:
            self._rescale()
        self._last_read = None

    def _rescale(self) -> None:
        scale = 1.0 / self._increment
        for row in self._rows:
            row[:] = [c * scale for c in row]
        self._total *= scale
        self._increment = 1.0

    def share(self, block: int) -> float:
        """Recent share of requests whose leading blocks include ``block`` (over-estimate), by
        the requests counted so far."""
        first, second = self._rows
        ((a, b),) = self._slots((block,))
        floor = self.params.min_requests * self._increment / self._growth
        return min(first[a], second[b]) / max(self._total, floor)

    def _read_once_counted(self, blocks: tuple[int, ...]) -> _Read:
        """The shares of ``blocks``' slots after :meth:`observe` of ``blocks``, computed
        without counting them: the same float operations in the same order as :meth:`observe`
        and :meth:`_rescale`, so a read followed by a count agrees with the state it leaves,
        bit for bit. O(len(blocks)); the answer is kept until the next count."""
        slots = self._slots(blocks)
        if self._last_read is not None:
            return self._last_read
        inc = self._increment
        first, second = self._rows
        total = self._total + inc
        increment = inc * self._growth
        scale = 1.0  # x * 1.0 == x: no rescale costs no rounding
        if increment > _RESCALE_AT:
            scale = 1.0 / increment
            total *= scale
            increment = 1.0
        denominator = max(total, self.params.min_requests * increment / self._growth)
        # min(x * scale, y * scale) == min(x, y) * scale exactly: rounding is monotonic.
        if len({a for a, _ in slots}) == len({b for _, b in slots}) == len(slots):
            shares = [min(first[a] + inc, second[b] + inc) * scale / denominator for a, b in slots]
        else:  # a slot met twice (a collision) is added to twice, as in observe
            after_first: dict[int, float] = {}
            after_second: dict[int, float] = {}
            for a, b in slots:
                after_first[a] = after_first.get(a, first[a]) + inc
                after_second[b] = after_second.get(b, second[b]) + inc
            shares = [min(after_first[a], after_second[b]) * scale / denominator for a, b in slots]
        self._last_read = _Read(shares, denominator / total, inc * scale / denominator)
        return self._last_read

    def threshold(self, n_backends: int) -> float:
        """The share above which a block is hot among ``n_backends`` backends."""
        return self.params.hot_share / max(n_backends, 1)

    def depth(self, blocks: tuple[int, ...], n_backends: int) -> int:
        """Index of the key block in ``blocks`` (which must be non-empty)."""
        threshold = self.threshold(n_backends)
        shares = self._read_once_counted(blocks).shares
        for d, share in enumerate(shares):
            if share <= threshold:
                return d
        return len(shares) - 1

    def key(self, blocks: tuple[int, ...], n_backends: int) -> int | None:
        """The key block of ``blocks``, or ``None`` for a request without blocks."""
        if not blocks:
            return None
        return blocks[self.depth(blocks, n_backends)]

    def choose(self, blocks: tuple[int, ...], n_backends: int) -> KeyChoice | None:
        """The key, and the homes of the hot prefix above it; ``None`` for a request without
        blocks."""
        if not blocks:
            return None
        read = self._read_once_counted(blocks)
        threshold = self.threshold(n_backends)
        parent: int | None = None
        parent_share = share = 0.0
        for block, share in zip(blocks, read.shares, strict=False):
            if share <= threshold:
                key = block
                break
            if parent is None and share * read.unfloor < n_backends * threshold:
                parent = block
            parent_share = share
        else:
            key = blocks[len(read.shares) - 1]
        if parent is None or parent == key:
            return KeyChoice(key, None, max(n_backends, 1), max(0.0, share - read.own))
        homes = math.ceil(parent_share / threshold)
        return KeyChoice(key, parent, homes, parent_share / homes)


@dataclass(frozen=True, slots=True)
class _Read:
    """One read of the sketch for a request (:meth:`PrefixKeySelector._read_once_counted`):
    ``shares`` of its blocks once it is counted (with the ``min_requests`` floor),
    ``unfloor`` (>= 1) turns a share into its share of the requests actually counted, and
    ``own`` is the part of each share that is this request's own count."""

    shares: list[float]
    unfloor: float
    own: float
