"""The engine's block hashes for a request's leading tokens, computed in the router.

vLLM chains one hash per full block of ``block_size`` tokens (``hash_block_tokens`` in
``vllm/v1/core/kv_cache_utils.py``): ``hash_i = H((hash_{i-1}, tuple(tokens_i), extra_i))``,
with ``hash_{-1} = H(seed)``. With ``--prefix-caching-hash-algo sha256_cbor`` (the one the
router supports: the others pickle Python objects) ``H`` is SHA-256 over canonical CBOR, the
same bytes from any language. ``seed`` is the engine's ``PYTHONHASHSEED`` when set, else
``"vllm-none-hash"`` (``constants.KV_EVENTS_HASH_SEED``). ``extra_i`` is None, except for the
first block of a request with a ``cache_salt``: ``(("cache_salt", salt),)``. Requests for a
LoRA adapter (keyed by its path, which the router does not know), with images or with prompt
embeddings get no hashes: the router routes them by its rendezvous ranking.

Events carry the low 64 bits of each hash (``wire.block_key``); :meth:`BlockHasher.keys`
returns those. Cost: one CBOR encoding and one SHA-256 per block.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import cbor2

from prefixserving import constants
from prefixserving.router.kv_events.wire import block_key


def sha256_cbor(value: object) -> bytes:
    """vLLM's ``sha256_cbor``: SHA-256 of the canonical CBOR encoding of ``value``."""
    return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()


class BlockHasher:
    """Block hashes of ``block_size``-token blocks, chained from ``seed``."""

    def __init__(self, block_size: int, seed: str = constants.KV_EVENTS_HASH_SEED) -> None:
        if block_size < 1:
            raise ValueError(f"block size must be at least 1, got {block_size}")
        self.block_size = block_size
        self.none_hash = sha256_cbor(seed)

    def hashes(self, tokens: Sequence[int], cache_salt: str | None = None) -> list[bytes]:
        """The full hash of every full block of ``tokens``, first block first."""
        size = self.block_size
        parent = self.none_hash
        out = []
        for start in range(0, len(tokens) - size + 1, size):
            extra = (("cache_salt", cache_salt),) if start == 0 and cache_salt else None
            parent = sha256_cbor((parent, tuple(tokens[start : start + size]), extra))
            out.append(parent)
        return out

    def keys(self, tokens: Sequence[int], cache_salt: str | None = None) -> tuple[int, ...]:
        """:meth:`hashes` as the index's keys (their low 64 bits, as in the events)."""
        return tuple(block_key(h) for h in self.hashes(tokens, cache_salt))
