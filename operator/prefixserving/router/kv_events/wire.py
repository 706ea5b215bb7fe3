"""The wire format of vLLM's KV cache events (``--kv-events-config``, ZMQ publisher).

An engine publishes one ZMQ multipart message per batch on its PUB socket:
``(topic, sequence, payload)``. ``sequence`` is an 8-byte big-endian counter that starts at 0
when the engine starts and grows by one per batch; ``payload`` is a msgpack ``EventBatch``,
an array ``[ts, events, data_parallel_rank]`` (``ts``: the engine's ``time.time()`` when it
made the batch). Each event is a msgpack map tagged by its ``type``:

- ``BlockStored``: ``block_hashes`` (a chain, parent first), ``parent_block_hash``,
  ``token_ids``, ``block_size``, ``lora_name``, ``medium``, ``extra_keys``, ...
- ``BlockRemoved``: ``block_hashes``, ``medium``.
- ``AllBlocksCleared``: the engine dropped its whole prefix cache.

A block hash is 8 bytes' worth of int by default (vLLM's ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``:
the low 64 bits of the engine's block hash) or the full hash as bytes; :func:`block_key` maps
both to the same int.

The replay socket (ZMQ ROUTER) answers a request carrying an 8-byte big-endian start sequence
with every buffered batch from that sequence on, each as ``(topic, sequence, payload)``, then
an end marker whose sequence is -1 (:data:`END_SEQUENCE`).

Fields this module does not name (vLLM adds some in each release) are ignored when decoding.
Cost: one msgspec decode per batch, linear in its size.
"""

from __future__ import annotations

import msgspec

SEQUENCE_BYTES = 8
END_SEQUENCE = -1
# vLLM's medium of blocks in the engine's own KV cache; None in events of older engines.
MEDIUM_ENGINE = "GPU"
_KEY_MASK = (1 << 64) - 1

ExternalBlockHash = int | bytes


class BlockStored(msgspec.Struct, tag=True, omit_defaults=True):
    """Blocks the engine added to its prefix cache (``block_hashes``: parent first)."""

    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None = None
    block_size: int = 0
    lora_name: str | None = None
    medium: str | None = None


class BlockRemoved(msgspec.Struct, tag=True, omit_defaults=True):
    """Blocks the engine evicted from its prefix cache."""

    block_hashes: list[ExternalBlockHash]
    medium: str | None = None


class AllBlocksCleared(msgspec.Struct, tag=True, omit_defaults=True):
    """The engine dropped every cached block (a cache reset)."""


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True):
    """One published batch: the engine's wall-clock ``ts`` and its events, in order."""

    ts: float
    events: list[KvEvent]
    data_parallel_rank: int | None = None


_DECODER = msgspec.msgpack.Decoder(EventBatch)


class WireError(ValueError):
    """A message that is not a KV event batch."""


def decode_batch(payload: bytes) -> EventBatch:
    """The batch in a message's payload; :class:`WireError` if it is not one."""
    try:
        return _DECODER.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise WireError(f"not a KV event batch: {error}") from error


def decode_sequence(frame: bytes) -> int:
    """The sequence number of a message (8 bytes, big-endian, signed: -1 ends a replay)."""
    if len(frame) != SEQUENCE_BYTES:
        raise WireError(f"sequence frame of {len(frame)} bytes, expected {SEQUENCE_BYTES}")
    return int.from_bytes(frame, "big", signed=True)


def encode_sequence(sequence: int) -> bytes:
    """The 8-byte big-endian frame of ``sequence`` (a replay request's start)."""
    return sequence.to_bytes(SEQUENCE_BYTES, "big", signed=True)


def block_key(block_hash: ExternalBlockHash) -> int:
    """The int a block hash is indexed by: the low 64 bits of the hash, as vLLM converts it
    for events by default (an int hash is already that)."""
    if isinstance(block_hash, bytes):
        return int.from_bytes(block_hash, "big") & _KEY_MASK
    return block_hash & _KEY_MASK


def in_engine_cache(medium: str | None) -> bool:
    """Whether an event's ``medium`` is the engine's own KV cache (not an offload tier)."""
    return medium is None or medium == MEDIUM_ENGINE
