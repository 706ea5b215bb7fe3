"""Prompts for real engines: shared-prefix groups as chat messages, text or token ids.

:class:`PrefixGroups` is every real-engine workload (the demo, the local stack's benchmarks, the
router against its peers, warm-up against cold, PEEK against stock): ``groups`` shared
prefixes of ``prefix_len`` units, and ``per_group`` requests per group, each its group's prefix
plus a unique suffix of ``suffix_len`` units, so requests of a group share a long prefix and
requests of different groups share nothing. Units are words (chat and text: common English
words, about one WordPiece token each in the engines' BERT vocabulary) or token ids (ids in
``TOKEN_IDS``, prompts sent as lists). In chat form the prefix is the system message ("You are
assistant number G. ...") and the suffix the user's question ("Question G.I: ...?").

Requests are shuffled, then arrive as a Poisson process of ``rate_per_s`` (none: all at time
0, for a closed loop of concurrent clients). Everything is a pure function of the parameters
and ``seed``: prefixes draw from one generator, suffixes, the order and the arrivals from
another, so a workload with more requests per group keeps the same prefixes. With
``order_seed`` the order comes from that seed alone: workloads with different seeds (fresh
content) and the same ``order_seed`` send their groups in the same order.

Cost: O(groups x per_group x (prefix_len + suffix_len)).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

PromptKind = Literal["chat", "text", "tokens"]
CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
# Token ids of token-id prompts: clear of the special tokens of both vocabularies (BERT's 30522
# and the dummy Llama's 32000).
TOKEN_IDS = range(1000, 29000)

# Common English words: about one WordPiece token each with the BERT vocabulary.
WORDS = (
    "the of and to in is you that it he was for on are as with his they at be this have from or "
    "one had by word but not what all were we when your can said there use an each which she do "
    "how their if will up other about out many then them these so some her would make like him "
    "into time has look two more write go see number no way could people my than first water "
    "been call who oil its now find long down day did get come made may part over new sound take "
    "only little work know place year live me back give most very after thing our just name good "
    "sentence man think say great where help through much before line right too mean old any same "
    "tell boy follow came want show also around form three small set put end does another well "
    "large must big even such because turn here why ask went men read need land different home us "
    "move try kind hand picture again change off play spell air away animal house point page letter"
).split()


@dataclass(frozen=True, slots=True)
class TimedRequest:
    """A request body to POST to ``path`` at ``arrival_s`` after the replay starts."""

    arrival_s: float
    path: str
    body: Mapping[str, Any]


def words(rng: random.Random, count: int) -> str:
    """``count`` words drawn from :data:`WORDS`."""
    return " ".join(rng.choice(WORDS) for _ in range(count))


def token_ids(rng: random.Random, count: int) -> list[int]:
    """``count`` token ids drawn from :data:`TOKEN_IDS`."""
    return [rng.randrange(TOKEN_IDS.start, TOKEN_IDS.stop) for _ in range(count)]


@dataclass(frozen=True, slots=True)
class PrefixGroups:
    """Shared-prefix groups (module docstring); lengths are in words or token ids."""

    groups: int = 8
    per_group: int = 8
    prefix_len: int = 600
    suffix_len: int = 24
    rate_per_s: float | None = None
    seed: int = 0
    order_seed: int | None = None

    def __post_init__(self) -> None:
        if self.groups < 1 or self.per_group < 1 or self.prefix_len < 0 or self.suffix_len < 0:
            raise ValueError("groups and per_group must be >= 1, lengths >= 0")
        if self.rate_per_s is not None and self.rate_per_s <= 0:
            raise ValueError(f"rate_per_s must be > 0, got {self.rate_per_s}")

    def system_prompts(self) -> list[str]:
        """The groups' prefixes as text (the system messages of the chat form)."""
        rng = random.Random(f"system-{self.seed}")
        return [
            f"You are assistant number {g}. {words(rng, self.prefix_len)}"
            for g in range(self.groups)
        ]

    def token_prefixes(self) -> list[list[int]]:
        """The groups' prefixes as token ids."""
        rng = random.Random(f"system-{self.seed}")
        return [token_ids(rng, self.prefix_len) for _ in range(self.groups)]

    def requests(
        self,
        kind: PromptKind,
        *,
        model: str,
        max_tokens: int,
        extra: Mapping[str, Any] | None = None,
    ) -> list[TimedRequest]:
        """Every request in send order, as ``kind`` bodies for ``model`` (greedy sampling,
        ``max_tokens`` out, ``extra`` fields added)."""
        rng = random.Random(f"requests-{self.seed}")
        fields = {"model": model, "max_tokens": max_tokens, "temperature": 0.0, **(extra or {})}
        bodies: list[tuple[str, dict[str, Any]]] = []
        if kind == "tokens":
            for prefix in self.token_prefixes():
                for _ in range(self.per_group):
                    prompt = prefix + token_ids(rng, self.suffix_len)
                    bodies.append((COMPLETIONS_PATH, {**fields, "prompt": prompt}))
        else:
            for g, system in enumerate(self.system_prompts()):
                for i in range(self.per_group):
                    question = f"Question {g}.{i}: {words(rng, self.suffix_len)}?"
                    if kind == "chat":
                        messages = [
                            {"role": "system", "content": system},
                            {"role": "user", "content": question},
                        ]
                        bodies.append((CHAT_PATH, {**fields, "messages": messages}))
                    else:
                        bodies.append(
                            (COMPLETIONS_PATH, {**fields, "prompt": f"{system} {question}"})
                        )
        order = rng if self.order_seed is None else random.Random(f"order-{self.order_seed}")
        order.shuffle(bodies)
        arrivals = poisson_arrivals(len(bodies), self.rate_per_s, rng)
        return [
            TimedRequest(arrival, path, body)
            for arrival, (path, body) in zip(arrivals, bodies, strict=True)
        ]

    def warmup_prompts(self) -> list[dict[str, object]]:
        """The prefix list a warm-up replays: each group's system prompt, as clients send it."""
        return [{"messages": [{"role": "system", "content": s}]} for s in self.system_prompts()]

    def ideal_hit_rate(self, block_tokens: int) -> float:
        """Token-id form: the share of prompt tokens one unbounded cache with ``block_tokens``
        blocks serves, each prefix computed once (full blocks only)."""
        prompt = self.prefix_len + self.suffix_len
        shared = self.prefix_len // block_tokens * block_tokens
        return (self.per_group - 1) * shared / (self.per_group * prompt) if prompt else 0.0


def poisson_arrivals(n: int, rate_per_s: float | None, rng: random.Random) -> list[float]:
    """``n`` arrival times from 0 of a Poisson process of ``rate_per_s`` (the first at 0);
    all 0 when ``rate_per_s`` is None."""
    if rate_per_s is None:
        return [0.0] * n
    arrival, out = 0.0, []
    for _ in range(n):
        out.append(arrival)
        arrival += rng.expovariate(rate_per_s)
    return out
