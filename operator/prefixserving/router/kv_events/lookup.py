"""Per request, how many leading blocks each engine holds: ``RoutingContext.cached``.

Tokens (``tokens``), then block keys (``hashing``), then depth per backend (``index``).
Requests the router cannot hash as the engine does (a LoRA adapter: ``model`` other than the
base model) get none, and are routed by the policy's rendezvous ranking alone. Cost: one
tokenization, ``max_tokens / block_size`` hashes and O(depth) per backend.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from prefixserving.router.kv_events.hashing import BlockHasher
from prefixserving.router.kv_events.index import KvIndex
from prefixserving.router.kv_events.tokens import RequestTokenizer

log = logging.getLogger(__name__)


class CachedBlocks:
    """Engine-reported cached depth of request bodies (module docstring)."""

    def __init__(
        self,
        index: KvIndex,
        hasher: BlockHasher,
        tokenizer: RequestTokenizer,
        base_model: str | None = None,
    ) -> None:
        self.index = index
        self.hasher = hasher
        self.tokenizer = tokenizer
        self.base_model = base_model

    def keys(self, body: Mapping[str, Any]) -> tuple[int, ...]:
        """The block keys of ``body``'s leading full blocks (empty: none, or not hashable)."""
        if self.base_model is not None and body.get("model") != self.base_model:
            return ()
        try:
            tokens = self.tokenizer.tokens(body)
        except Exception as error:  # the engine judges the body; the router only ranks
            log.debug("no engine tokens for this body: %r", error)
            return ()
        if not tokens:
            return ()
        salt = body.get("cache_salt")
        return self.hasher.keys(tokens, salt if isinstance(salt, str) else None)

    def depths(self, keys: tuple[int, ...], backends: Iterable[str]) -> dict[str, int]:
        """``RoutingContext.cached`` for block ``keys`` (``KvIndex.cached``)."""
        return self.index.cached(backends, keys)
