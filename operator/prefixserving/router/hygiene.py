"""Prefix hygiene: how often a request's first prefix block was never seen before, per model.

A template that puts a timestamp, a request id or a user name before the shared system prompt
or document makes every first block unique, which silently turns the prefix cache off. This
module measures it and names the likely cause.

**Algorithm**

1. Per model, keep the first-block hashes seen recently in an LRU set of ``memory_blocks``
   hashes; a request's first block is *new* when it is not in the set.
2. Per model, keep the last ``window`` outcomes (new or not) and their running sum; the
   ratio is ``new / window`` (over fewer requests at start).
3. Keep the first-block text of the last ``samples`` new requests. To diagnose, find where
   consecutive samples first differ, take the run of id-like characters around that offset
   in each, and classify the runs: a timestamp (dates, clock times, 10- or 13-digit epoch
   numbers), a request id (UUIDs, long hex or mixed letter-and-digit strings), another
   number, or other per-request text (a user name, say). Samples that differ at offset 0
   share no leading text at all.

**Parameters**: ``window`` (500 requests), ``memory_blocks`` (65,536 hashes per model),
``samples`` (16), ``min_requests`` (50: no verdict before), ``threshold`` (0.5: above it a
hint is given), ``max_models`` (32 model labels; later models count as ``other``).

**Cost**: O(1) per request; the diagnosis is O(``samples * block_chars``) and runs only when a
report is asked for (a ``/metrics`` scrape or the hygiene endpoint).
"""

from __future__ import annotations

import enum
import itertools
import re
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from prefixserving.router.prefix_hashing import ContentKind, PrefixKey

OTHER_MODEL = "other"

_TIMESTAMP = re.compile(
    r"\d{4}-\d{2}-\d{2}|\d{1,2}:\d{2}(:\d{2})?|\d{4}/\d{2}/\d{2}|\d{2}/\d{2}/\d{4}|^\d{10}(\d{3})?$"
)
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_HEX_ID = re.compile(r"^[0-9a-fA-F]{8,}$")
_ID_CHARS = re.compile(r"[A-Za-z0-9_\-:.+/T]")


class Cause(enum.StrEnum):
    """The likely reason for new first blocks; the ``cause`` label of the hygiene metric."""

    HEALTHY = "healthy"  # ratio below the threshold, or too few requests to tell
    TIMESTAMP = "timestamp"
    REQUEST_ID = "request_id"
    NUMBER = "number"
    PER_REQUEST_TEXT = "per_request_text"
    PER_REQUEST_TOKENS = "per_request_tokens"
    NO_SHARED_PREFIX = "no_shared_prefix"


_CAUSE_TEXT = {
    Cause.TIMESTAMP: "a timestamp",
    Cause.REQUEST_ID: "a request id",
    Cause.NUMBER: "a per-request number",
    Cause.PER_REQUEST_TEXT: "per-request text (a user name, for example)",
    Cause.PER_REQUEST_TOKENS: "per-request token ids",
}


@dataclass(frozen=True, slots=True)
class HygieneReport:
    """One model's figures. ``new_ratio``: fraction of the last ``requests`` requests whose
    first block was new. ``offset``: where the samples start to differ (characters, or token
    positions for token prompts), None when unknown. ``hint``: one sentence for the
    resource's status, empty when healthy."""

    model: str
    requests: int
    new_ratio: float
    cause: Cause
    offset: int | None
    hint: str


@dataclass
class _ModelStats:
    memory_blocks: int
    window: int
    samples: int
    seen: OrderedDict[int, None] = field(default_factory=OrderedDict)
    outcomes: deque[bool] = field(default_factory=deque)
    new_count: int = 0
    recent_new: deque[tuple[ContentKind, str]] = field(default_factory=deque)

    def observe(self, key: PrefixKey) -> bool:
        first = key.blocks[0]
        is_new = first not in self.seen
        if is_new:
            self.seen[first] = None
            if len(self.seen) > self.memory_blocks:
                self.seen.popitem(last=False)
            self.recent_new.append((key.kind, key.first_block))
            if len(self.recent_new) > self.samples:
                self.recent_new.popleft()
        else:
            self.seen.move_to_end(first)
        self.outcomes.append(is_new)
        self.new_count += is_new
        if len(self.outcomes) > self.window:
            self.new_count -= self.outcomes.popleft()
        return is_new


def _first_difference(a: list[str] | str, b: list[str] | str) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def _run_at(text: str, offset: int) -> str:
    """The maximal run of id-like characters around ``offset``."""
    if offset >= len(text):
        return ""
    start = offset
    while start > 0 and _ID_CHARS.match(text[start - 1]):
        start -= 1
    end = offset
    while end < len(text) and _ID_CHARS.match(text[end]):
        end += 1
    return text[start:end]


def _classify(run: str) -> Cause:
    if _TIMESTAMP.search(run):
        return Cause.TIMESTAMP
    if _UUID.search(run) or _HEX_ID.match(run):
        return Cause.REQUEST_ID
    if run.isdigit():
        return Cause.NUMBER
    if len(run) >= 8 and any(c.isdigit() for c in run) and any(c.isalpha() for c in run):
        return Cause.REQUEST_ID
    return Cause.PER_REQUEST_TEXT


def diagnose(samples: list[tuple[ContentKind, str]]) -> tuple[Cause, int | None]:
    """The likely cause of distinct first blocks and the offset where they start to differ."""
    if len(samples) < 2:
        return Cause.PER_REQUEST_TEXT, None
    if samples[-1][0] is ContentKind.TOKENS:
        tokens = [text.split() for _, text in samples]
        offsets = [_first_difference(a, b) for a, b in itertools.pairwise(tokens)]
        offset = min(offsets)
        return (Cause.NO_SHARED_PREFIX if offset == 0 else Cause.PER_REQUEST_TOKENS), offset
    texts = [text for _, text in samples]
    offsets = [_first_difference(a, b) for a, b in itertools.pairwise(texts)]
    offset = min(offsets)
    votes: dict[Cause, int] = {}
    for text in texts:
        run = _run_at(text, offset)
        if run:
            cause = _classify(run)
            votes[cause] = votes.get(cause, 0) + 1
    if not votes:
        return (Cause.NO_SHARED_PREFIX if offset == 0 else Cause.PER_REQUEST_TEXT), offset
    cause = max(votes, key=lambda c: votes[c])
    if offset == 0 and cause is Cause.PER_REQUEST_TEXT:
        return Cause.NO_SHARED_PREFIX, offset
    return cause, offset


def hint(model: str, ratio: float, cause: Cause, offset: int | None) -> str:
    """One sentence for the resource's status: how much, where, the likely cause, the fix."""
    share = f"{ratio:.0%} of requests for model {model!r} start with a prefix block never seen"
    if cause is Cause.NO_SHARED_PREFIX:
        return (
            f"{share} before, and they share no leading text: start prompts with the shared "
            "system prompt or document so the prefix cache can hit."
        )
    unit = "token position" if cause is Cause.PER_REQUEST_TOKENS else "character"
    where = f" at {unit} {offset}" if offset is not None else ""
    return (
        f"{share} before; they differ{where}, where the prompt carries {_CAUSE_TEXT[cause]}. "
        "Move per-request fields after the shared system prompt or document so the prefix "
        "cache can hit."
    )


class PrefixHygiene:
    """Per-model new-first-block ratios and their diagnosis (see the module docstring)."""

    def __init__(
        self,
        *,
        window: int = 500,
        memory_blocks: int = 65_536,
        samples: int = 16,
        min_requests: int = 50,
        threshold: float = 0.5,
        max_models: int = 32,
    ) -> None:
        self.window = window
        self.memory_blocks = memory_blocks
        self.samples = samples
        self.min_requests = min_requests
        self.threshold = threshold
        self.max_models = max_models
        self._models: dict[str, _ModelStats] = {}

    def observe(self, key: PrefixKey) -> bool | None:
        """Record one request; True when its first block is new, None for empty content."""
        if not key.blocks:
            return None
        label = self.label(key.model)
        stats = self._models.get(label)
        if stats is None:
            stats = _ModelStats(self.memory_blocks, self.window, self.samples)
            self._models[label] = stats
        return stats.observe(key)

    def label(self, model: str) -> str:
        """``model`` itself, or ``other`` once ``max_models`` labels exist (bounds cardinality)."""
        if model in self._models or len(self._models) < self.max_models:
            return model
        return OTHER_MODEL

    def report(self) -> list[HygieneReport]:
        out = []
        for model, stats in sorted(self._models.items()):
            requests = len(stats.outcomes)
            ratio = stats.new_count / requests if requests else 0.0
            if requests < self.min_requests or ratio < self.threshold:
                out.append(HygieneReport(model, requests, ratio, Cause.HEALTHY, None, ""))
                continue
            cause, offset = diagnose(list(stats.recent_new))
            out.append(
                HygieneReport(
                    model, requests, ratio, cause, offset, hint(model, ratio, cause, offset)
                )
            )
        return out
