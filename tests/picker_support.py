"""Driving the endpoint picker as Envoy's ext_proc filter does: an in-process picker (grpc.aio
in the test's event loop) and a client for one stream; the messages a gateway sends are
``prefixserving_lab.runners.gateway``'s.

What this double does not do that Envoy does: route the request to the picked endpoint,
retry down the fallback list, apply the header mutation, or time out a slow picker (the
gateway's ``message_timeout``). ``e2e/test_gateway_e2e.py`` runs a real gateway for those.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc
from envoy.service.ext_proc.v3.external_processor_pb2 import ProcessingRequest, ProcessingResponse

from prefixserving.router.app import Router, RouterConfig
from prefixserving.router.backends import BackendPool, PoolConfig
from prefixserving.router.picker.server import PickerServer
from prefixserving.router.picker.stream import PickerConfig
from prefixserving.router.policies.base import RoutingPolicy
from prefixserving.router.policies.registry import make_policy
from prefixserving.router.prefix_hashing import KeyConfig
from prefixserving_lab.runners.gateway import chunks, picked, request_body, request_headers


def chat_body(content: str, model: str = "base", **extra: Any) -> bytes:
    return json.dumps(
        {"model": model, "messages": [{"role": "user", "content": content}], **extra}
    ).encode()


def picker_router(
    backends: Iterable[str],
    policy: RoutingPolicy | None = None,
    pool_config: PoolConfig | None = None,
    max_body_bytes: int | None = None,
) -> Router:
    config = RouterConfig(max_body_bytes=max_body_bytes) if max_body_bytes else None
    return Router(
        pool=BackendPool(static=list(backends), config=pool_config),
        policy=policy or make_policy("prefix-affinity"),
        key_config=KeyConfig(base_model="base"),
        config=config,
    )


@dataclass
class RunningPicker:
    server: PickerServer
    channel: grpc.aio.Channel

    @property
    def stub(self) -> external_processor_pb2_grpc.ExternalProcessorStub:
        return external_processor_pb2_grpc.ExternalProcessorStub(self.channel)


@contextlib.asynccontextmanager
async def running_picker(
    router: Router, config: PickerConfig | None = None, health_interval_s: float = 0.05
) -> AsyncIterator[RunningPicker]:
    """A plaintext picker on a free loopback port in this event loop, with a channel to it."""
    server = PickerServer(router, config or PickerConfig(), "127.0.0.1:0", None, health_interval_s)
    port = await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield RunningPicker(server, channel)
    finally:
        await channel.close()
        await server.stop(0)


class Stream:
    """One ext_proc stream, driven message by message."""

    def __init__(self, picker: RunningPicker) -> None:
        self.call = picker.stub.Process()

    async def send(self, *messages: ProcessingRequest) -> None:
        for message in messages:
            await self.call.write(message)

    async def read(self, count: int = 1) -> list[ProcessingResponse]:
        out = []
        for _ in range(count):
            answer = await self.call.read()
            assert answer is not grpc.aio.EOF, "the picker ended the stream"
            out.append(answer)
        return out

    async def close(self) -> list[ProcessingResponse]:
        """Half-close, as Envoy does at the end of the request; the remaining answers."""
        await self.call.done_writing()
        rest = []
        while (answer := await self.call.read()) is not grpc.aio.EOF:
            rest.append(answer)
        return rest


async def pick(picker: RunningPicker, raw: bytes, chunk_bytes: int = 1 << 16) -> str:
    """Send one chat request in chunks and end the stream; the picked endpoints."""
    stream = Stream(picker)
    parts = chunks(raw, chunk_bytes)
    await stream.send(request_headers())
    for number, part in enumerate(parts, start=1):
        await stream.send(request_body(part, end_of_stream=number == len(parts)))
    (answer,) = await stream.read()
    await stream.read(len(parts))
    header, metadata = picked(answer)
    assert header == metadata
    await stream.close()
    return header
