"""The prefixes a warm-up replays: parsed from the prompts file and from the router's answer.

**Prompts file** (``--prompts-file``; the operator mounts the spec's ``warmup.prompts`` or the
referenced ConfigMap key there): a JSON list, each item exactly one of

- ``{"prompt": "..."}``: sent to ``/v1/completions``;
- ``{"messages": [{"role": "system", "content": "..."}, ...]}``: sent to
  ``/v1/chat/completions``, so the engine renders it with its own chat template, exactly as it
  renders client traffic, and the cached blocks match.

These are the ``WarmupPrompt`` items of the ``PrefixServing`` API. A missing file, broken JSON or
a bad item is reported as a problem (counted as a failure) and the other items are kept.

**Router answer** (``GET /v1/prefixserving/hot-prefixes``, see ``prefixserving.router.hot``):
``{"prefixes": [{"kind": "chat" | "completion", "body": {...}}, ...]}``; ``body`` is replayed
as it is.

Every request gets ``max_tokens: 1`` (only the prefill matters) and no streaming. Equal bodies
are replayed once. Cost: O(total prompt characters).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Kind = Literal["chat", "completion"]
Source = Literal["file", "router"]

ENDPOINTS: dict[str, str] = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}


@dataclass(frozen=True, slots=True)
class WarmupRequest:
    """One prefix to replay: the request body as clients send it, without ``max_tokens``."""

    kind: Kind
    body: Mapping[str, Any]
    source: Source

    @property
    def path(self) -> str:
        return ENDPOINTS[self.kind]

    def payload(self, model: str | None) -> dict[str, Any]:
        """The body to POST: ``max_tokens`` 1, no streaming, ``model`` filled in if missing."""
        out = dict(self.body)
        if model is not None and not out.get("model"):
            out["model"] = model
        out["max_tokens"] = 1
        out["stream"] = False
        return out

    def identity(self) -> str:
        """Canonical JSON of kind and body: equal identities warm the same blocks."""
        return json.dumps([self.kind, self.body], sort_keys=True, separators=(",", ":"))


def load_prompts_file(path: Path) -> tuple[list[WarmupRequest], list[str]]:
    """Requests from the prompts file, and one message per problem found."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return [], [f"{path}: no such file (mount the warm-up ConfigMap there)"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return [], [f"{path}: not valid JSON: {exc}"]
    if not isinstance(data, list):
        return [], [f"{path}: expected a JSON list of prompts, got {type(data).__name__}"]
    return parse_prompts(data, origin=str(path))


def parse_prompts(items: Iterable[object], origin: str) -> tuple[list[WarmupRequest], list[str]]:
    """Requests from ``WarmupPrompt`` items; problems name the item's index."""
    requests: list[WarmupRequest] = []
    problems: list[str] = []
    for index, item in enumerate(items):
        parsed = _parse_prompt(item)
        if isinstance(parsed, str):
            problems.append(f"{origin}[{index}]: {parsed}")
        else:
            requests.append(parsed)
    return requests, problems


def _parse_prompt(item: object) -> WarmupRequest | str:
    if not isinstance(item, dict):
        return f"expected an object with 'prompt' or 'messages', got {type(item).__name__}"
    prompt, messages = item.get("prompt"), item.get("messages")
    if (prompt is None) == (messages is None):
        return "set exactly one of 'prompt' and 'messages'"
    if prompt is not None:
        if not isinstance(prompt, str) or not prompt:
            return "'prompt' must be a non-empty string"
        return WarmupRequest("completion", {"prompt": prompt}, "file")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty list"
    for message in messages:
        if not (
            isinstance(message, dict)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
        ):
            return "each message needs a string 'role' and a string 'content'"
    return WarmupRequest("chat", {"messages": messages}, "file")


def parse_hot_prefixes(answer: object) -> tuple[list[WarmupRequest], list[str]]:
    """Requests from the router's hot-prefix answer, and one message per unusable row."""
    rows = answer.get("prefixes") if isinstance(answer, dict) else None
    if not isinstance(rows, list):
        return [], ["router answer has no 'prefixes' list"]
    requests: list[WarmupRequest] = []
    problems: list[str] = []
    for index, row in enumerate(rows):
        kind = row.get("kind") if isinstance(row, dict) else None
        body = row.get("body") if isinstance(row, dict) else None
        if kind not in ENDPOINTS or not isinstance(body, dict):
            problems.append(f"router prefixes[{index}]: expected 'kind' chat|completion and 'body'")
            continue
        requests.append(WarmupRequest(kind, body, "router"))
    return requests, problems


def unique(requests: Iterable[WarmupRequest]) -> list[WarmupRequest]:
    """``requests`` without repeats, first occurrence kept."""
    seen: set[str] = set()
    out = []
    for request in requests:
        identity = request.identity()
        if identity not in seen:
            seen.add(identity)
            out.append(request)
    return out
