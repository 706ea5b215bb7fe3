"""The endpoint picker's servers, in one event loop: gRPC (the ext_proc service and the health
services) on ``--grpc-port``, and the router's HTTP admin routes on ``--port`` (``/metrics``,
the hot prefixes the warm-up sidecar asks for, hygiene, ``/healthz``, ``/readyz``), whose
lifespan runs the backend pool's discovery and load scraping, as in the HTTP router.

**TLS** (``secure``): the gateways that call an endpoint picker expect TLS by default and do
not verify the certificate (the upstream picker serves a self-signed one), so with no
certificate files given the picker makes a self-signed one at start (ECDSA P-256, 10 years).
Plaintext (``--no-secure-serving``) is for gateways or meshes that connect in the clear
(Istio without a TLS DestinationRule for the picker, a mesh that adds mTLS itself).

**Health**: ``liveness`` is SERVING while the process runs; ``readiness`` and the ext_proc
service are SERVING while the router takes requests (``Router.takes_requests``: an engine
takes traffic, or requests are held while none does; re-checked every ``health_interval_s``),
NOT_SERVING otherwise, as the router's ``/readyz``.

Cost: one task per stream (grpc.aio) and the per-message work of ``picker.stream``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc
from envoy.service.ext_proc.v3.external_processor_pb2 import ProcessingRequest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from prefixserving.router.app import Router, build_admin_app
from prefixserving.router.picker import protocol
from prefixserving.router.picker.stream import PickerConfig, PickStream
from prefixserving.router.server import uvicorn_config

log = logging.getLogger(__name__)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
# gRPC messages may carry a whole buffered body (BUFFERED mode): the body limit plus room.
_MESSAGE_ROOM_BYTES = 1024 * 1024
_SHUTDOWN_GRACE_S = 5.0


class ExternalProcessor(external_processor_pb2_grpc.ExternalProcessorServicer):
    """The ext_proc service: one :class:`~prefixserving.router.picker.stream.PickStream`
    per ``Process`` stream."""

    def __init__(self, router: Router, config: PickerConfig) -> None:
        self.router = router
        self.config = config

    async def Process(
        self, request_iterator: AsyncIterator[ProcessingRequest], context: Any
    ) -> None:
        stream = PickStream(self.router, self.config)
        try:
            async for request in request_iterator:
                for answer in await stream.handle(request):
                    await context.write(answer)
                if stream.finished:
                    break
        finally:  # closed, cancelled, or ended after an immediate response
            stream.close()


def self_signed_certificate() -> tuple[bytes, bytes]:
    """A new ECDSA P-256 key and a self-signed certificate for it, both PEM."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "prefixserving-endpoint-picker")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return key_pem, certificate.public_bytes(serialization.Encoding.PEM)


@dataclass
class PickerServer:
    """The gRPC server of one picker. ``tls``: ``(key PEM, certificate PEM)``, or None for
    plaintext. :meth:`start` binds ``address`` (port 0: any free port) and returns the port."""

    router: Router
    config: PickerConfig
    address: str
    tls: tuple[bytes, bytes] | None
    health_interval_s: float = 1.0

    def __post_init__(self) -> None:
        size = self.router.config.max_body_bytes + _MESSAGE_ROOM_BYTES
        self.server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", size),
                ("grpc.max_send_message_length", size),
            ]
        )
        external_processor_pb2_grpc.add_ExternalProcessorServicer_to_server(
            ExternalProcessor(self.router, self.config), self.server
        )
        self.health = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self._health_task: asyncio.Task[None] | None = None

    async def start(self) -> int:
        if self.tls is None:
            port = self.server.add_insecure_port(self.address)
        else:
            credentials = grpc.ssl_server_credentials([self.tls])
            port = self.server.add_secure_port(self.address, credentials)
        await self.health.set(protocol.LIVENESS, SERVING)
        await self._set_readiness()
        await self.server.start()
        self._health_task = asyncio.create_task(self._keep_health())
        return port

    async def _set_readiness(self) -> None:
        status = SERVING if self.router.takes_requests() else NOT_SERVING
        for service in (protocol.READINESS, protocol.EXT_PROC_SERVICE):
            await self.health.set(service, status)

    async def _keep_health(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            await self._set_readiness()

    async def stop(self, grace_s: float = _SHUTDOWN_GRACE_S) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
        await self.server.stop(grace_s)


async def run(
    router: Router,
    config: PickerConfig,
    *,
    host: str,
    grpc_port: int,
    http_port: int,
    tls: tuple[bytes, bytes] | None,
    log_config: dict[str, Any] | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT (uvicorn's signal handling ends both servers)."""
    import uvicorn

    picker = PickerServer(router, config, f"{host}:{grpc_port}", tls)
    port = await picker.start()
    log.info("endpoint picker on %s:%d (%s)", host, port, "TLS" if tls else "plaintext")
    http = uvicorn.Server(
        uvicorn_config(build_admin_app(router), host=host, port=http_port, log_config=log_config)
    )
    try:
        await http.serve()
    finally:
        await picker.stop()
