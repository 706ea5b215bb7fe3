"""Stable hashing and rendezvous ranking shared by the affinity policies.

Everything here is a pure function of its arguments and identical in every process and on
every machine (no salted ``hash()``), which is what lets router replicas agree.

- :func:`mix64`: the SplitMix64 finaliser, a bijective 64-bit mixer (3 multiply-xorshifts).
- :func:`backend_hash`: BLAKE2b (8 bytes) of a backend id, memoised.
- :func:`rendezvous_rank`: highest-random-weight (rendezvous) hashing. Each backend scores
  ``mix64(key ^ backend_hash(b) ^ seed)``; backends sort by score, highest first, ties by id.
  When a backend joins, a key moves only if the newcomer outscores its current first choice,
  so about 1/(N+1) of the keys move and all of them move to the newcomer; when one leaves,
  only the keys it ranked first move. O(N log N) per ranking, O(N) for :func:`rendezvous_top`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from functools import lru_cache

MASK64 = (1 << 64) - 1


def mix64(value: int) -> int:
    """SplitMix64 finaliser of ``value`` (taken modulo 2**64)."""
    z = (value + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


@lru_cache(maxsize=4096)
def backend_hash(backend: str) -> int:
    """A stable 64-bit hash of a backend id."""
    return int.from_bytes(hashlib.blake2b(backend.encode(), digest_size=8).digest(), "big")


def _score(key: int, backend: str, seed: int) -> int:
    return mix64((key & MASK64) ^ backend_hash(backend) ^ seed)


def rendezvous_rank(key: int, backends: Iterable[str], seed: int = 0) -> list[str]:
    """Backends ordered by rendezvous score for ``key``, best first."""
    return sorted(backends, key=lambda b: (-_score(key, b, seed), b))


def rendezvous_top(key: int, backends: Sequence[str], seed: int = 0) -> str:
    """The first backend of :func:`rendezvous_rank` in O(N); ``backends`` must be non-empty."""
    return min(backends, key=lambda b: (-_score(key, b, seed), b))
