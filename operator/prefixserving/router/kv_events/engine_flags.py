"""The vLLM flags that make an engine publish the KV cache events this package follows.

``--kv-events-config``: the ZMQ publisher bound on every address of the engine's pod at
``port`` (replay at ``replay_port``), on ``constants.KV_EVENTS_TOPIC``.
``--prefix-caching-hash-algo``: ``constants.KV_EVENTS_HASH_ALGO``, the block hash the router
recomputes (``hashing``).
"""

from __future__ import annotations

import json

from prefixserving import constants


def engine_args(
    port: int = constants.KV_EVENTS_PORT, replay_port: int = constants.KV_EVENTS_REPLAY_PORT
) -> tuple[str, ...]:
    """The engine's command-line arguments for KV cache events on ``port``/``replay_port``."""
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{port}",
        "replay_endpoint": f"tcp://*:{replay_port}",
        "topic": constants.KV_EVENTS_TOPIC,
    }
    return (
        "--kv-events-config",
        json.dumps(config, separators=(",", ":")),
        "--prefix-caching-hash-algo",
        constants.KV_EVENTS_HASH_ALGO,
    )
