"""The local stack as a user runs it: `prefixserving stack up`, a request, `stack down`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from prefixserving_lab.reports.demo import markdown
from prefixserving_lab.runners.stack.demo import DemoWorkload, StackResult
from prefixserving_lab.runners.stack.engines import MODEL_NAME, EngineConfig, engine_env


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "prefixserving.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=1200,
    )


@pytest.mark.slow
def test_stack_up_serves_through_the_router_and_down_stops_it(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.json"
    system = "You are the stack test assistant. " * 40
    prompts.write_text(json.dumps([{"messages": [{"role": "system", "content": system}]}]))
    state_dir = tmp_path / "state"
    started = _cli("stack", "up", "--engines", "1", "--warmup-file", str(prompts),
                   "--state-dir", str(state_dir), cwd=tmp_path)  # fmt: skip
    try:
        assert started.returncode == 0, started.stderr
        router = next(
            line.split()[1] for line in started.stdout.splitlines() if line.startswith("router:")
        )
        body = {
            "model": MODEL_NAME,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": "Where is the treasure?"},
            ],
            "max_tokens": 4,
        }
        response = httpx.post(f"{router}/v1/chat/completions", json=body, timeout=120)
        assert response.status_code == 200, response.text
        # The warm-up sidecar pre-filled the system prompt: the first real request hits it.
        assert response.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        assert _cli("stack", "up", "--state-dir", str(state_dir), cwd=tmp_path).returncode != 0
    finally:
        stopped = _cli("stack", "down", "--state-dir", str(state_dir), cwd=tmp_path)
    assert stopped.returncode == 0, stopped.stderr
    assert not (state_dir / "state.json").exists()
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{router}/healthz", timeout=2)


def test_demo_workload_is_deterministic_and_shares_prefixes_within_groups() -> None:
    workload = DemoWorkload(groups=3, per_group=4, system_words=50)
    first, second = workload.requests(), workload.requests()
    assert first == second
    assert len(first) == 12
    systems = {r.body["messages"][0]["content"] for r in first}  # type: ignore[index]
    assert len(systems) == 3
    questions = {r.body["messages"][1]["content"] for r in first}  # type: ignore[index]
    assert len(questions) == 12
    arrivals = [r.arrival_s for r in first]
    assert arrivals == sorted(arrivals)
    assert {p["messages"][0]["content"] for p in workload.warmup_prompts()} == systems


def test_demo_markdown_reports_ratios() -> None:
    def result(name: str, hit: float, p50: float) -> StackResult:
        return StackResult(
            name, "peek", "prefix-affinity", True, 10, 0, hit, p50, 2 * p50, 5.0, 2.0
        )

    text = markdown([result("prefixserving", 0.8, 0.1), result("baseline", 0.2, 0.4)], "2 cores")
    assert "hit rate 4.00x" in text
    assert "TTFT p50 0.25x" in text
    assert "| prefixserving | peek |" in text


def test_engines_start_unpinned_unless_the_caller_sets_a_binding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    assert engine_env(EngineConfig())["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0-3")
    assert engine_env(EngineConfig())["VLLM_CPU_OMP_THREADS_BIND"] == "0-3"
    per_engine = EngineConfig(env={"VLLM_CPU_OMP_THREADS_BIND": "1"})
    assert engine_env(per_engine)["VLLM_CPU_OMP_THREADS_BIND"] == "1"
