"""The router's block hashes equal vLLM's own (``hash_block_tokens`` with ``sha256_cbor``,
the seed vLLM derives, the cache salt as vLLM keys it, and the int the events carry).
Imports vLLM, hence slow; the real engine's events are checked in
``test_kv_events_real_engine.py``."""

from __future__ import annotations

import pytest

from prefixserving import constants
from prefixserving.router.kv_events.hashing import BlockHasher

pytestmark = pytest.mark.slow


def test_hashes_equal_vllms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils as utils

    hash_fn = get_hash_fn_by_name(constants.KV_EVENTS_HASH_ALGO)
    utils.init_none_hash(hash_fn)
    tokens = list(range(1000, 1000 + 16 * 3 + 5))
    for salt in (None, "tenant-a"):
        expected, parent = [], None
        for i in range(3):
            extra = (("cache_salt", salt),) if i == 0 and salt else None
            parent = utils.hash_block_tokens(hash_fn, parent, tokens[16 * i : 16 * i + 16], extra)
            expected.append(parent)
        hasher = BlockHasher(16)
        assert hasher.hashes(tokens, salt) == expected
        assert hasher.keys(tokens, salt) == tuple(
            utils.maybe_convert_block_hash(h) for h in expected
        )
    assert BlockHasher(16, seed="7").hashes(tokens) != BlockHasher(16).hashes(tokens)
