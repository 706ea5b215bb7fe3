"""``prefixserving router --mode endpoint-picker`` as users run it: its usage errors, and the
real process (TLS with its self-signed certificate) picking for a gateway stream, serving the
gRPC health services and, on its HTTP port, the metrics and hot prefixes warm-up reads."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from click.testing import CliRunner
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from picker_support import chat_body
from prefixserving import constants
from prefixserving.cli import main
from prefixserving.router.picker import protocol
from prefixserving.router.picker.server import self_signed_certificate
from prefixserving_lab.runners.fake_engine import FakeEngine
from prefixserving_lab.runners.gateway import (
    picked,
    request_body,
    request_headers,
    response_body,
    trusting_credentials,
)
from prefixserving_lab.runners.gateway import response_headers as response_headers_message
from prefixserving_lab.runners.stack.processes import free_port
from router_support import engine_in_thread
from support.processes import wait_for_answer

PICKER_FLAGS = (
    "--mode", "--grpc-port", "--secure-serving", "--no-secure-serving", "--tls-cert-file",
    "--tls-key-file", "--shed-waiting-requests",
)  # fmt: skip


def test_help_lists_the_picker_flags() -> None:
    result = CliRunner().invoke(main, ["router", "--help"])
    assert result.exit_code == 0
    for flag in PICKER_FLAGS:
        assert flag in result.output
    assert "endpoint-picker" in result.output


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--workers", "2"], "--workers applies to --mode proxy only"),
        (["--no-secure-serving", "--tls-cert-file", "CERT", "--tls-key-file", "KEY"], "needs"),
        (["--tls-cert-file", "CERT"], "together"),
    ],
)
def test_picker_usage_errors(extra: list[str], message: str, tmp_path: Path) -> None:
    for name in ("CERT", "KEY"):
        (tmp_path / name).write_text("x")
    args = [str(tmp_path / a) if a in ("CERT", "KEY") else a for a in extra]
    command = ["router", "--mode", "endpoint-picker", "--backend", "http://a:1", *args]
    result = CliRunner().invoke(main, command)
    assert result.exit_code == 2
    assert message in result.output


def test_the_self_signed_certificate_is_one_grpc_serves() -> None:
    key, certificate = self_signed_certificate()
    assert key.startswith(b"-----BEGIN PRIVATE KEY-----")
    grpc.ssl_server_credentials([(key, certificate)])  # raises on a bad pair


@contextlib.contextmanager
def picker_command(*backends: str) -> Iterator[tuple[subprocess.Popen[bytes], int, int]]:
    http_port, grpc_port = free_port(), free_port()
    command = [
        sys.executable, "-m", "prefixserving.cli", "router", "--mode", "endpoint-picker",
        "--host", "127.0.0.1", "--port", str(http_port), "--grpc-port", str(grpc_port),
        "--model", "fake-model", "--scrape-interval-s", "0.1",
        *(part for url in backends for part in ("--backend", url)),
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        yield process, http_port, grpc_port
    finally:
        process.terminate()
        process.communicate(timeout=20)


@pytest.mark.slow
def test_the_picker_process_picks_over_tls_and_serves_what_warm_up_asks() -> None:
    engines = [FakeEngine(name="e0"), FakeEngine(name="e1")]
    with (
        engine_in_thread(engines[0]) as first,
        engine_in_thread(engines[1]) as second,
        picker_command(first, second) as (process, http_port, grpc_port),
    ):
        base = f"http://127.0.0.1:{http_port}"
        wait_for_answer(process, f"{base}/readyz", 200)
        credentials, options = trusting_credentials("127.0.0.1", grpc_port)
        target = f"127.0.0.1:{grpc_port}"
        with grpc.secure_channel(target, credentials, options=options) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in (protocol.LIVENESS, protocol.READINESS, protocol.EXT_PROC_SERVICE):
                check = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
                assert check.status == health_pb2.HealthCheckResponse.SERVING
            stub = external_processor_pb2_grpc.ExternalProcessorStub(channel)
            system = "You summarise contracts for the legal team. " * 30
            raw = chat_body(system + "Contract 1", model="fake-model")
            firsts = []
            for _ in range(2):  # hot prefixes list a prefix seen twice
                answers = list(
                    stub.Process(
                        iter(
                            [
                                request_headers(),
                                request_body(raw[:500]),
                                request_body(raw[500:], True),
                                response_headers_message(200),
                                response_body(b"data: [DONE]\n\n", True),
                            ]
                        ),
                        timeout=10,
                    )
                )
                header, metadata = picked(answers[0])
                assert header == metadata
                assert sorted(header.split(",")) == sorted(map(protocol.endpoint, (first, second)))
                firsts.append(protocol.backend(header.split(",")[0]))
                echoed = b"".join(
                    a.request_body.response.body_mutation.streamed_response.body
                    for a in answers[1:3]
                )
                assert echoed == raw
        assert firsts[0] == firsts[1]  # the same prefix, the same engine
        metrics = httpx.get(f"{base}/metrics").text
        ok = f'prefixserving_router_requests_total{{backend="{firsts[0]}",outcome="ok"}} 2.0'
        assert ok in metrics
        member = "http://127.0.0.1:1"
        hot = httpx.get(f"{base}{constants.ROUTER_HOT_PREFIXES_PATH}", params={"member": member})
        assert hot.status_code == 200 and hot.json()["member"] == member
        every = httpx.get(f"{base}{constants.ROUTER_HOT_PREFIXES_PATH}").json()["prefixes"]
        assert json.dumps(every[0]["body"]).startswith('{"model": "fake-model"')
    assert process.returncode in (0, -15)
