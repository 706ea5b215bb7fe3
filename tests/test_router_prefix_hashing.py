"""Prefix keys: block chaining, chat rendering, token prompts, adapter- and salt-aware keys."""

from __future__ import annotations

import subprocess
import sys

import pytest

from prefixserving.router.prefix_hashing import (
    MAX_NESTING,
    ContentKind,
    KeyConfig,
    RequestError,
    chat_key,
    completion_key,
    nests_deeper_than,
    render_chat,
    replay_body,
)

CONFIG = KeyConfig(block_chars=16, prefix_blocks=4)
SYSTEM = "You are a helpful assistant that answers in French. " * 2


def chat(*user: str, model: str = "base", **extra: object) -> dict:
    messages = [{"role": "system", "content": SYSTEM}]
    messages += [{"role": "user", "content": text} for text in user]
    return {"model": model, "messages": messages, **extra}


def shared_blocks(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    count = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        count += 1
    return count


def test_text_prompts_share_exactly_their_common_full_blocks() -> None:
    a = completion_key({"model": "m", "prompt": "x" * 40 + "AAAAAAAAAAAAAAAAAAAA"}, CONFIG)
    b = completion_key({"model": "m", "prompt": "x" * 40 + "BBBBBBBBBBBBBBBBBBBB"}, CONFIG)
    # 40 shared characters = 2 full blocks of 16; the third block differs.
    assert len(a.blocks) == len(b.blocks) == 3
    assert shared_blocks(a.blocks, b.blocks) == 2
    assert a.kind is ContentKind.TEXT and a.first_block == "x" * 16


def test_depth_is_bounded_and_partial_tail_is_not_hashed() -> None:
    key = completion_key({"model": "m", "prompt": "y" * 1000}, CONFIG)
    assert len(key.blocks) == CONFIG.prefix_blocks
    short = completion_key({"model": "m", "prompt": "y" * 20}, CONFIG)
    assert len(short.blocks) == 1  # 20 chars: one full block, the 4-char tail is not hashed
    tiny = completion_key({"model": "m", "prompt": "hi"}, CONFIG)
    assert len(tiny.blocks) == 1  # shorter than a block: one short block
    assert completion_key({"model": "m", "prompt": ""}, CONFIG).blocks == ()


def test_token_prompts_use_token_blocks_and_batches_use_their_first_prompt() -> None:
    assert CONFIG.block_tokens == 4
    ids = list(range(100))
    key = completion_key({"model": "m", "prompt": ids}, CONFIG)
    assert key.kind is ContentKind.TOKENS and len(key.blocks) == 4
    other = completion_key({"model": "m", "prompt": ids[:8] + [999] * 8}, CONFIG)
    assert shared_blocks(key.blocks, other.blocks) == 2
    batch = completion_key({"model": "m", "prompt": [ids, [5, 6, 7]]}, CONFIG)
    assert batch.blocks == key.blocks
    text = completion_key({"model": "m", "prompt": " ".join(map(str, ids))}, CONFIG)
    assert text.blocks[0] != key.blocks[0]  # text and token namespaces never collide


def test_chat_rendering_is_canonical_and_ordered() -> None:
    a = {
        "role": "user",
        "content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "you"}],
    }
    b = {"role": "user", "content": "hello you"}
    assert render_chat([a])[0] == render_chat([b])[0]
    image = {"type": "image_url", "image_url": {"url": "data:x", "detail": "low"}}
    reordered = {"type": "image_url", "image_url": {"detail": "low", "url": "data:x"}}
    assert (
        render_chat([{"role": "user", "content": [image]}])[0]
        == render_chat([{"role": "user", "content": [reordered]}])[0]
    )
    swapped = [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}]
    assert render_chat(swapped)[0] != render_chat(list(reversed(swapped)))[0]


def test_chat_requests_sharing_a_system_prompt_share_leading_blocks() -> None:
    config = KeyConfig(block_chars=16, prefix_blocks=16)
    a = chat_key(chat("What is the weather?"), config)
    b = chat_key(chat("Tell me a joke"), config)
    system_blocks = (len("<|system|>\n") + len(SYSTEM) + 1) // 16
    assert shared_blocks(a.blocks, b.blocks) >= system_blocks
    assert a.blocks != b.blocks
    tools = chat_key(chat("What is the weather?", tools=[{"type": "function"}]), config)
    assert tools.blocks[0] != a.blocks[0]


def test_adapters_and_salts_never_share_a_block() -> None:
    config = KeyConfig(block_chars=16, prefix_blocks=4, base_model="base")
    body = {"prompt": "z" * 64}
    base = completion_key({"model": "base", **body}, config)
    lora_a = completion_key({"model": "sql-lora", **body}, config)
    lora_b = completion_key({"model": "chat-lora", **body}, config)
    salted = completion_key({"model": "base", "cache_salt": "tenant-1", **body}, config)
    salted2 = completion_key({"model": "base", "cache_salt": "tenant-2", **body}, config)
    keys = [base, lora_a, lora_b, salted, salted2]
    for i, left in enumerate(keys):
        for right in keys[i + 1 :]:
            assert not set(left.blocks) & set(right.blocks)
    assert salted.salted and not base.salted
    again = completion_key({"model": "sql-lora", **body}, config)
    assert again.blocks == lora_a.blocks
    chat_a = chat_key(chat("q", model="sql-lora"), config)
    chat_b = chat_key(chat("q", model="base"), config)
    assert chat_a.blocks[0] != chat_b.blocks[0]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ([1, 2], None),
        ({"prompt": "x"}, "model"),
        ({"model": "", "prompt": "x"}, "model"),
        ({"model": 3, "prompt": "x"}, "model"),
        ({"model": "m"}, "prompt"),
        ({"model": "m", "prompt": {"a": 1}}, "prompt"),
        ({"model": "m", "prompt": [1, "a"]}, "prompt"),
        ({"model": "m", "prompt": "x", "cache_salt": 5}, "cache_salt"),
    ],
)
def test_completion_bodies_that_cannot_be_keyed(body: object, param: str | None) -> None:
    with pytest.raises(RequestError) as error:
        completion_key(body, CONFIG)  # type: ignore[arg-type]
    assert error.value.param == param


@pytest.mark.parametrize("messages", [None, "hi", [1, 2], [{"role": "user"}, "x"]])
def test_chat_bodies_that_cannot_be_keyed(messages: object) -> None:
    with pytest.raises(RequestError) as error:
        chat_key({"model": "m", "messages": messages}, CONFIG)
    assert error.value.param == "messages"


@pytest.mark.slow
def test_keys_are_stable_across_processes() -> None:
    code = (
        "from prefixserving.router.prefix_hashing import KeyConfig, completion_key;"
        "print(completion_key({'model': 'm', 'prompt': 'q' * 64}, KeyConfig(16, 4)).blocks)"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outputs) == 1
    assert outputs.pop().strip() == str(
        completion_key({"model": "m", "prompt": "q" * 64}, KeyConfig(16, 4)).blocks
    )


def test_replay_body_keeps_only_the_leading_content() -> None:
    config = KeyConfig(block_chars=16, prefix_blocks=8)
    body = chat("What is the weather?", temperature=0.3, max_tokens=9)
    key = chat_key(body, config)
    replay = replay_body(body, key, 3, config)
    assert set(replay) == {"model", "messages"}
    assert replay["messages"] == [{"role": "system", "content": SYSTEM[: 48 - len("<|system|>\n")]}]
    assert chat_key(replay, config).blocks == key.blocks[:3]
    prompt = {"model": "m", "prompt": list(range(50)), "temperature": 1.0}
    tokens = completion_key(prompt, config)
    assert replay_body(prompt, tokens, 2, config) == {"model": "m", "prompt": list(range(8))}


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize("field", ["content", "tools"])
def test_chat_nesting_is_bounded_the_same_at_any_stack_depth(field: str) -> None:
    """MAX_NESTING levels are keyed and their replay body renders even with most of the
    interpreter's stack in use; one more level is refused naming the limit. (The limit used
    to be wherever json.dumps ran out of stack: the key passed and the hot-prefix replay
    body, rendered deeper in the router's stack, raised RecursionError.)"""

    def body(depth: int) -> dict:
        if field == "content":
            return {"model": "m", "messages": [{"role": "user", "content": nested(depth)}]}
        return {**chat("q"), "tools": nested(depth)}

    assert not nests_deeper_than(nested(MAX_NESTING), MAX_NESTING)
    assert nests_deeper_than(nested(MAX_NESTING + 1), MAX_NESTING)
    ok = MAX_NESTING

    def deep_in_the_stack(levels: int) -> None:
        if levels:
            deep_in_the_stack(levels - 1)
            return
        key = chat_key(body(ok), CONFIG)
        replay_body(body(ok), key, len(key.blocks), CONFIG)

    deep_in_the_stack(sys.getrecursionlimit() - 2 * MAX_NESTING - 100)
    with pytest.raises(RequestError, match=f"more than {MAX_NESTING} levels"):
        chat_key(body(ok + 1), CONFIG)
