"""Prefix hygiene: new-first-block ratio per model and the diagnosis of its cause."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta

from prefixserving.router.hygiene import Cause, PrefixHygiene
from prefixserving.router.prefix_hashing import KeyConfig, chat_key, completion_key

CONFIG = KeyConfig()
SYSTEM = "You are the support assistant of ACME. Answer briefly and politely. " * 4
START = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)


def timestamped(i: int) -> dict:
    now = (START + timedelta(seconds=7 * i)).isoformat()
    return {
        "model": "llama",
        "messages": [
            {"role": "system", "content": f"Current time: {now}\n{SYSTEM}"},
            {"role": "user", "content": f"question {i}"},
        ],
    }


def clean(i: int) -> dict:
    return {
        "model": "llama",
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Current time: {START.isoformat()} question {i}"},
        ],
    }


def run(hygiene: PrefixHygiene, bodies: list[dict]) -> None:
    for body in bodies:
        hygiene.observe(chat_key(body, CONFIG))


def test_timestamp_before_the_shared_part_is_near_100_percent_and_named() -> None:
    hygiene = PrefixHygiene()
    run(hygiene, [timestamped(i) for i in range(200)])
    (report,) = hygiene.report()
    assert report.model == "llama" and report.requests == 200
    assert report.new_ratio >= 0.99
    assert report.cause is Cause.TIMESTAMP
    assert "timestamp" in report.hint and "llama" in report.hint
    # The rendered system message starts "<|system|>\nCurrent time: 2026-11-29T10:..."; the
    # samples first differ inside the clock time.
    assert report.offset is not None and len("<|system|>\nCurrent time: ") <= report.offset


def test_the_same_template_with_the_timestamp_moved_after_is_healthy() -> None:
    hygiene = PrefixHygiene()
    run(hygiene, [clean(i) for i in range(200)])
    (report,) = hygiene.report()
    assert report.new_ratio <= 0.01
    assert report.cause is Cause.HEALTHY and report.hint == ""


def test_request_ids_and_names_are_told_apart() -> None:
    ids = PrefixHygiene()
    for _ in range(100):
        ids.observe(
            completion_key({"model": "m", "prompt": f"[req {uuid.uuid4()}] {SYSTEM}"}, CONFIG)
        )
    assert ids.report()[0].cause is Cause.REQUEST_ID
    names = PrefixHygiene()
    people = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"]
    for i in range(100):
        prompt = f"Hello {people[i % 8]}{'x' * (i // 8)}, {SYSTEM}"
        names.observe(completion_key({"model": "m", "prompt": prompt}, CONFIG))
    assert names.report()[0].cause is Cause.PER_REQUEST_TEXT


def test_token_prompts_and_prompts_with_nothing_in_common() -> None:
    tokens = PrefixHygiene()
    for i in range(100):
        tokens.observe(
            completion_key({"model": "m", "prompt": [1, 2, 3, 1000 + i] + [7] * 64}, CONFIG)
        )
    (report,) = tokens.report()
    assert report.cause is Cause.PER_REQUEST_TOKENS and report.offset == 3
    unrelated = PrefixHygiene()
    rng = random.Random(0)
    words = ["apple", "river", "stone", "cloud", "maple", "tiger", "ocean", "piano", "lemon"]
    for _ in range(100):
        prompt = " ".join(rng.choice(words) for _ in range(40))
        unrelated.observe(completion_key({"model": "m", "prompt": prompt}, CONFIG))
    assert unrelated.report()[0].cause is Cause.NO_SHARED_PREFIX


def test_window_slides_and_models_are_separate_and_bounded() -> None:
    hygiene = PrefixHygiene(window=100, max_models=2)
    run(hygiene, [timestamped(i) for i in range(100)])
    run(hygiene, [clean(i) for i in range(100)])
    (report,) = hygiene.report()
    assert report.new_ratio == 0.01  # only the first clean request was new in the last 100
    for model in ("a", "b", "c"):
        hygiene.observe(completion_key({"model": model, "prompt": SYSTEM}, CONFIG))
    assert [r.model for r in hygiene.report()] == ["a", "llama", "other"]


def test_too_few_requests_give_no_verdict() -> None:
    hygiene = PrefixHygiene(min_requests=50)
    run(hygiene, [timestamped(i) for i in range(10)])
    assert hygiene.report()[0].cause is Cause.HEALTHY
    assert hygiene.observe(completion_key({"model": "m", "prompt": ""}, CONFIG)) is None
