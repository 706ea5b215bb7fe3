"""Parsing the prompts file and the router's hot-prefix answer."""

from __future__ import annotations

import json
from pathlib import Path

from prefixserving.api.types import WarmupPrompt
from prefixserving.warmup.prompts import (
    WarmupRequest,
    load_prompts_file,
    parse_hot_prefixes,
    unique,
)


def test_prompts_file_gives_chat_and_completion_requests(tmp_path: Path) -> None:
    path = tmp_path / "prompts.json"
    items = [
        {"prompt": "You are a helpful assistant."},
        {"messages": [{"role": "system", "content": "Be brief."}]},
    ]
    path.write_text(json.dumps(items))
    requests, problems = load_prompts_file(path)
    assert problems == []
    assert [(r.kind, r.path) for r in requests] == [
        ("completion", "/v1/completions"),
        ("chat", "/v1/chat/completions"),
    ]
    payload = requests[1].payload("m")
    assert payload == {
        "messages": [{"role": "system", "content": "Be brief."}],
        "model": "m",
        "max_tokens": 1,
        "stream": False,
    }


def test_api_prompts_round_trip_through_the_file(tmp_path: Path) -> None:
    """The operator writes the spec's WarmupPrompt items as JSON: the sidecar reads them all."""
    prompts = [
        WarmupPrompt(prompt="doc"),
        WarmupPrompt.model_validate({"messages": [{"role": "user", "content": "hi"}]}),
    ]
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps([p.model_dump(by_alias=True, exclude_none=True) for p in prompts]))
    requests, problems = load_prompts_file(path)
    assert problems == [] and len(requests) == 2


def test_bad_items_are_reported_and_good_ones_kept(tmp_path: Path) -> None:
    path = tmp_path / "prompts.json"
    items = [
        {"prompt": "ok"},
        {"prompt": "a", "messages": [{"role": "user", "content": "b"}]},
        {"messages": [{"role": "user"}]},
        "just a string",
        {"prompt": ""},
    ]
    path.write_text(json.dumps(items))
    requests, problems = load_prompts_file(path)
    assert [r.body for r in requests] == [{"prompt": "ok"}]
    assert len(problems) == 4
    assert problems[0].endswith("[1]: set exactly one of 'prompt' and 'messages'")


def test_missing_and_broken_files_are_problems(tmp_path: Path) -> None:
    requests, problems = load_prompts_file(tmp_path / "absent.json")
    assert requests == [] and "no such file" in problems[0]
    broken = tmp_path / "broken.json"
    broken.write_text("[{not json")
    requests, problems = load_prompts_file(broken)
    assert requests == [] and "not valid JSON" in problems[0]
    wrong = tmp_path / "object.json"
    wrong.write_text('{"prompt": "x"}')
    assert "expected a JSON list" in load_prompts_file(wrong)[1][0]


def test_hot_prefix_answer_keeps_bodies_as_sent() -> None:
    body = {"model": "m", "messages": [{"role": "system", "content": "S"}]}
    answer = {
        "prefixes": [
            {"kind": "chat", "body": body, "hits": 3, "blocks": 2},
            {"kind": "embedding", "body": {}},
        ]
    }
    requests, problems = parse_hot_prefixes(answer)
    assert [r.body for r in requests] == [body]
    assert requests[0].payload("other")["model"] == "m"
    assert len(problems) == 1
    assert parse_hot_prefixes([])[1] == ["router answer has no 'prefixes' list"]


def test_unique_drops_repeats_in_order() -> None:
    a = WarmupRequest("completion", {"prompt": "a"}, "file")
    b = WarmupRequest("completion", {"prompt": "b"}, "router")
    a_again = WarmupRequest("completion", {"prompt": "a"}, "router")
    assert unique([a, b, a_again]) == [a, b]
