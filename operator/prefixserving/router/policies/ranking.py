"""Stable hashing and rendezvous ranking shared by the affinity policies.

Everything here is a pure function of its arguments and identical in every process and on
every machine (no salted ``hash()``), which is what lets router replicas agree.

- :func:`mix64`: the SplitMix64 finaliser, a bijective 64-bit mixer (3 multiply-xorshifts).
- :func:`backend_hash`: BLAKE2b (8 bytes) of a backend id, memoised.
- :func:`rendezvous_rank`: highest-random-weight (rendezvous) hashing. Each backend scores
  ``mix64(key ^ backend_hash(identity(b)) ^ seed)``; backends sort by score, highest first,
  ties by id. When a backend joins, a key moves only if the newcomer outscores its current
  first choice, so about 1/(N+1) of the keys move and all of them move to the newcomer; when
  one leaves, only the keys it ranked first move. O(N log N) per ranking, O(N) for
  :func:`rendezvous_top`.

**Identities** (``identities``: backend id -> routing identity; a backend missing from it is
its own identity): a backend scores by its identity, not its id. An engine pod that replaced
another in a rolling update reports that pod's identity (the warm-up handover,
``warmup.handover``), so it takes exactly the replaced pod's place in every ranking and no
other key moves; without identities each replacement moves about 2/N of the keys (the old
pod's to the others, then a share of everyone's to the new pod). Two backends with one
identity (the old and the new pod while both are Ready) score alike and sit side by side,
ordered by id.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from types import MappingProxyType

MASK64 = (1 << 64) - 1
NO_IDENTITIES: Mapping[str, str] = MappingProxyType({})
"""Every backend is its own identity."""


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


def _score(key: int, identity: str, seed: int) -> int:
    return mix64((key & MASK64) ^ backend_hash(identity) ^ seed)


def rendezvous_rank(
    key: int,
    backends: Iterable[str],
    seed: int = 0,
    identities: Mapping[str, str] = NO_IDENTITIES,
) -> list[str]:
    """Backends ordered by rendezvous score for ``key``, best first (module docstring)."""
    return sorted(backends, key=lambda b: (-_score(key, identities.get(b, b), seed), b))


def rendezvous_top(
    key: int,
    backends: Sequence[str],
    seed: int = 0,
    identities: Mapping[str, str] = NO_IDENTITIES,
) -> str:
    """The first backend of :func:`rendezvous_rank` in O(N); ``backends`` must be non-empty."""
    return min(backends, key=lambda b: (-_score(key, identities.get(b, b), seed), b))
