"""Warm-up against fake engines and routers: every failure ends Ready, counted and logged."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.router_support import completion, metric_value, running_router
from tests.warmup_support import UsageEngine

from prefixserving.router.policies.prefix_affinity import PrefixAffinityPolicy
from prefixserving.warmup.events import build_event, emit_timeout_event, pod_identity
from prefixserving.warmup.handover import Handover
from prefixserving.warmup.runner import WarmupConfig, run_warmup
from prefixserving.warmup.server import build_app
from prefixserving.warmup.state import WarmupState
from prefixserving_lab.runners.fake_engine import FakeEngine, fake_engine_config, serving
from prefixserving_lab.runners.stack.processes import free_port
from prefixserving_lab.testing import wait_for_async
from support.processes import wait_for_answer


def _quiet(app: object) -> object:
    config = fake_engine_config(FakeEngine(name="unused"))
    config.app = app
    return config


async def _metrics(state: WarmupState) -> str:
    transport = httpx.ASGITransport(app=build_app(state))
    async with httpx.AsyncClient(transport=transport, base_url="http://sidecar") as client:
        return (await client.get("/metrics")).text


def _prompts(tmp_path: Path, items: object) -> Path:
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps(items))
    return path


async def test_readyz_is_503_until_warmup_finishes() -> None:
    state = WarmupState()
    transport = httpx.ASGITransport(app=build_app(state))
    async with httpx.AsyncClient(transport=transport, base_url="http://sidecar") as client:
        assert (await client.get("/readyz")).status_code == 503
        assert (await client.get("/healthz")).status_code == 200
        state.finish(timed_out=False)
        answer = await client.get("/readyz")
    assert answer.status_code == 200 and answer.json()["phase"] == "done"


async def test_prompts_are_replayed_with_max_tokens_1_and_counted(tmp_path: Path) -> None:
    engine = UsageEngine()
    items = [{"prompt": "one two three"}, {"messages": [{"role": "system", "content": "a b"}]}]
    async with serving(_quiet(engine.app())) as url:
        state = WarmupState()
        config = WarmupConfig(engine_url=url, prompts_file=_prompts(tmp_path, items), timeout_s=10)
        await run_warmup(config, state)
    paths = sorted(path for path, _ in engine.received)
    assert paths == ["/v1/chat/completions", "/v1/completions"]
    assert all(b["max_tokens"] == 1 and b["model"] == "fake-model" for _, b in engine.received)
    assert state.ready and not state.timed_out
    assert (state.warmed, state.failures, state.planned) == (2, 0, 2)
    text = await _metrics(state)
    assert metric_value(text, "prefixserving_warmup_prefixes_warmed_total", source="file") == 2
    assert metric_value(text, "prefixserving_warmup_tokens_warmed_total") == state.tokens_warmed > 0
    assert metric_value(text, "prefixserving_warmup_ready") == 1


async def test_broken_prefix_list_ends_ready_with_failure_counted(tmp_path: Path) -> None:
    engine = UsageEngine(refuse_containing="poison")
    broken = tmp_path / "prompts.json"
    broken.write_text('[{"prompt": "cut off')
    async with serving(_quiet(engine.app())) as url:
        state = WarmupState()
        await run_warmup(WarmupConfig(engine_url=url, prompts_file=broken, timeout_s=10), state)
        assert state.ready and not state.timed_out and state.failures == 1
        assert engine.received == []
        text = await _metrics(state)
        assert metric_value(text, "prefixserving_warmup_failures_total", stage="prompts") == 1

        mixed = [{"prompt": "fine"}, {"prompt": "poison pill"}, {"nothing": 1}]
        state = WarmupState()
        config = WarmupConfig(engine_url=url, prompts_file=_prompts(tmp_path, mixed), timeout_s=10)
        await run_warmup(config, state)
    text = await _metrics(state)
    assert state.ready and state.warmed == 1
    assert metric_value(text, "prefixserving_warmup_failures_total", stage="prompts") == 1
    assert metric_value(text, "prefixserving_warmup_failures_total", stage="replay") == 1


async def test_unreachable_router_ends_ready_with_failure_counted(tmp_path: Path) -> None:
    engine = UsageEngine()
    async with serving(_quiet(engine.app())) as url:
        state = WarmupState()
        config = WarmupConfig(
            engine_url=url,
            prompts_file=_prompts(tmp_path, [{"prompt": "still warmed"}]),
            router_url=f"http://127.0.0.1:{free_port()}",
            self_url="http://10.0.0.9:8000",
            hot_prefixes=8,
            timeout_s=30,
        )
        started = time.monotonic()
        await run_warmup(config, state)
    assert time.monotonic() - started < 10
    assert state.ready and not state.timed_out and state.warmed == 1
    text = await _metrics(state)
    assert metric_value(text, "prefixserving_warmup_failures_total", stage="router") == 1


async def test_slow_engine_times_out_ready_and_emits_the_timeout(tmp_path: Path) -> None:
    engine = UsageEngine(delay_s=60)
    notices: list[str] = []
    prompts = _prompts(tmp_path, [{"prompt": f"slow {i}"} for i in range(3)])
    async with serving(_quiet(engine.app())) as url:
        state = WarmupState()
        config = WarmupConfig(engine_url=url, prompts_file=prompts, timeout_s=1.5)
        started = time.monotonic()
        await run_warmup(config, state, on_timeout=notices.append)
        elapsed = time.monotonic() - started
        # The engine sees the cancelled requests go away.
        await wait_for_async(lambda: engine.aborted == 2, what="both requests aborted")
    # At the timeout, far from the 60 s the engine would take.
    assert 1.4 < elapsed < 30
    assert state.ready and state.timed_out and state.warmed == 0
    assert len(engine.received) == 2, "concurrency 2: the third prefix never started"
    assert len(notices) == 1 and "timed out after 1.5 s in phase warming" in notices[0]
    text = await _metrics(state)
    assert metric_value(text, "prefixserving_warmup_timeouts_total") == 1
    assert metric_value(text, "prefixserving_warmup_ready") == 1


async def test_engine_that_never_gets_healthy_times_out() -> None:
    engine = UsageEngine(healthy=False)
    async with serving(_quiet(engine.app())) as url:
        state = WarmupState()
        config = WarmupConfig(engine_url=url, timeout_s=1.0, poll_interval_s=0.1)
        await run_warmup(config, state)
    assert state.ready and state.timed_out
    assert state.summary()["phase"] == "timed_out"


async def _send_documents(client: httpx.AsyncClient, tag: str = "") -> None:
    """Three questions on each of 24 documents (named by ``tag``), through the router."""
    for group in range(24):
        document = f"{tag}shared document {group} " + "lorem ipsum dolor sit amet " * 40
        for question in range(3):
            body = completion(document + f" question {question}")
            assert (await client.post("/v1/completions", json=body)).status_code == 200


def _from_router(engine_url: str, router_url: str, **options: Any) -> WarmupConfig:
    """A warm-up of ``engine_url`` that takes up to 32 hot prefixes from ``router_url``."""
    return WarmupConfig(
        engine_url=engine_url,
        router_url=router_url,
        self_url=engine_url,
        hot_prefixes=32,
        timeout_s=20,
        **options,
    )


async def test_router_hot_prefixes_owned_by_the_new_member_are_replayed() -> None:
    """With the real router app and the prefix-affinity policy: the sidecar replays exactly the
    hot prefixes the router says the new member owns."""
    old = FakeEngine(name="old")
    new = UsageEngine()
    policy = PrefixAffinityPolicy()
    async with (
        serving(fake_engine_config(old)) as old_url,
        serving(_quiet(new.app())) as new_url,
        running_router([old_url], policy=policy) as router,
    ):
        await _send_documents(router.client)
        owned = router.router.hot.owned_by(new_url, [old_url], policy, 32)
        state = WarmupState()
        await run_warmup(_from_router(new_url, router.url), state)
    assert 0 < len(owned) < 24, "prefix affinity gives the new member some, not all, prefixes"
    assert sorted(b["prompt"] for _, b in new.received) == sorted(r.body["prompt"] for r in owned)
    assert state.warmed == len(owned) and state.failures == 0
    text = await _metrics(state)
    assert metric_value(text, "prefixserving_warmup_prefixes_warmed_total", source="router") == len(
        owned
    )


async def test_with_a_handover_the_replaced_engines_share_is_replayed_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ``handover_selector`` the sidecar claims the old pod it replaces (stubbed here:
    tests/test_warmup_handover.py claims against the API emulator) and asks the router with
    ``replaces``: it replays what it will own once the replaced engine is gone."""
    old_a, old_b, new = FakeEngine(name="a"), FakeEngine(name="b"), UsageEngine()
    policy = PrefixAffinityPolicy()
    asked: list[str] = []
    async with (
        serving(fake_engine_config(old_a)) as a_url,
        serving(fake_engine_config(old_b)) as b_url,
        serving(_quiet(new.app())) as new_url,
        running_router([a_url, b_url], policy=policy) as router,
    ):

        def claimed(env: object, selector: str) -> Handover:
            asked.append(selector)
            return Handover(a_url, "engine-a")

        monkeypatch.setattr("prefixserving.warmup.runner.resolve_handover", claimed)
        hot = router.router.hot
        # Which prefixes move depends on how the servers' random ports hash: documents are
        # added until one ranks the replaced engine first and the new member second, so that
        # the handover moves a key to it (24 documents hold none about 1 time in 80).
        for batch in range(4):
            await _send_documents(router.client, tag=f"batch {batch} ")
            joined = hot.owned_by(new_url, [a_url, b_url], policy, 32)
            handed = hot.owned_by(new_url, [a_url, b_url], policy, 32, replaces=a_url)
            if len(handed) > len(joined):
                break
        staying = hot.owned_by(new_url, [b_url], policy, 32)
        config = _from_router(new_url, router.url, handover_selector="app=engine")
        state = WarmupState()
        await run_warmup(config, state)
    assert asked == ["app=engine"]
    assert state.identity == "engine-a", "it serves the replaced pod's routing identity"
    assert len(handed) > len(joined), "the replaced engine's keys move, some to the new one"
    prompts = sorted(r.body["prompt"] for r in handed)
    assert prompts == sorted(r.body["prompt"] for r in staying), "the replaced engine is gone"
    assert sorted(b["prompt"] for _, b in new.received) == prompts


def test_event_only_inside_a_pod() -> None:
    assert pod_identity({"POD_NAME": "p", "POD_NAMESPACE": "ns"}) is None
    assert emit_timeout_event("x", env={}) is False
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "POD_NAME": "p", "POD_NAMESPACE": "ns"}
    assert pod_identity(env) == ("p", "ns", None)
    event = build_event("engine-0", "ns", "uid-1", "warm-up timed out")
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "engine-0",
        "namespace": "ns",
        "uid": "uid-1",
    }
    assert (event["reason"], event["type"]) == ("WarmupTimedOut", "Warning")


class _Events:
    def __init__(self, error: Exception | None = None) -> None:
        self.created: list[tuple[str, dict]] = []
        self.error = error

    def create_namespaced_event(self, namespace: str, body: dict) -> object:
        if self.error is not None:
            raise self.error
        self.created.append((namespace, body))
        return body


def test_event_is_posted_in_a_pod_and_failures_are_swallowed() -> None:
    env = {
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
        "POD_NAME": "chat-engine-7d9-abc",
        "POD_NAMESPACE": "llm",
        "POD_UID": "u-1",
    }
    events = _Events()
    assert emit_timeout_event("warm-up timed out after 5 s", env=env, api=lambda: events)
    ((namespace, body),) = events.created
    assert namespace == "llm" and body["involvedObject"]["name"] == "chat-engine-7d9-abc"
    assert body["message"] == "warm-up timed out after 5 s"
    refused = _Events(PermissionError("events is forbidden"))
    assert emit_timeout_event("x", env=env, api=lambda: refused) is False
    # in a pod without a token: the in-cluster configuration fails, the Event is skipped
    assert emit_timeout_event("x", env=env) is False


def _start_cli(engine_port: int, port: int, timeout_s: float) -> subprocess.Popen[bytes]:
    command = [
        sys.executable, "-m", "prefixserving.cli", "warmup",
        "--engine-url", f"http://127.0.0.1:{engine_port}", "--timeout-s", str(timeout_s),
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _readyz(process: subprocess.Popen[bytes], port: int, status: int) -> dict:
    return wait_for_answer(process, f"http://127.0.0.1:{port}/readyz", status).json()


@pytest.mark.slow
def test_cli_serves_readyz_after_warmup() -> None:
    """The real command in a process: Ready after the timeout when the engine never comes up,
    and it keeps serving /readyz afterwards (a native sidecar must not exit). 503 while warming
    is the next test's (its timeout is long enough to see it on any machine)."""
    port = free_port()
    process = _start_cli(free_port(), port, timeout_s=3)
    try:
        assert _readyz(process, port, 200)["phase"] == "timed_out"
        # Requests answered after the warm-up ended: the process is still serving.
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert metric_value(metrics, "prefixserving_warmup_timeouts_total") == 1
        assert _readyz(process, port, 200)["phase"] == "timed_out"
        assert process.poll() is None
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.mark.slow
def test_cli_exits_on_sigterm_while_warming() -> None:
    """Pod deletion during warm-up: the sidecar stops at once instead of waiting out the timeout."""
    port = free_port()
    process = _start_cli(free_port(), port, timeout_s=600)
    try:
        assert _readyz(process, port, 503)["phase"] == "waiting_for_engine"
        process.terminate()
        # uvicorn re-raises SIGTERM after its clean shutdown: the exit status is -15
        assert process.wait(timeout=10) in (0, -signal.SIGTERM)
    finally:
        if process.poll() is None:
            process.kill()
