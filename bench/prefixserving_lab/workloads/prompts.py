"""The shared-prefix chat workload of the local stack.

``groups`` system prompts of ``system_words`` words each; every request is one group's system
prompt plus a unique user question, so requests of a group share a long prefix and requests of
different groups share nothing. Requests are shuffled and arrive as a Poisson process of
``rate_per_s``. Everything is a pure function of the seed.
"""

from __future__ import annotations

import random

from prefixserving_lab.runners.client import TimedRequest
from prefixserving_lab.runners.stack.engines import MODEL_NAME

# Common English words: about one WordPiece token each with the BERT vocabulary.
_WORDS = (
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


def words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(count))


def system_prompts(groups: int, system_words: int, seed: int = 0) -> list[str]:
    """The ``groups`` shared system prompts (deterministic in ``seed``)."""
    rng = random.Random(f"system-{seed}")
    return [f"You are assistant number {g}. {words(rng, system_words)}" for g in range(groups)]


def chat_body(system: str, question: str, max_tokens: int) -> dict[str, object]:
    return {
        "model": MODEL_NAME,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ],
        "max_tokens": max_tokens,
        "temperature": 0.0,
    }


def shared_prefix_chat(
    *,
    groups: int = 8,
    per_group: int = 8,
    system_words: int = 600,
    question_words: int = 24,
    max_tokens: int = 8,
    rate_per_s: float = 2.0,
    seed: int = 0,
) -> list[TimedRequest]:
    """Shuffled shared-prefix chat requests with Poisson arrivals."""
    rng = random.Random(f"requests-{seed}")
    prompts = system_prompts(groups, system_words, seed)
    bodies = [
        chat_body(system, f"Question {g}.{i}: {words(rng, question_words)}?", max_tokens)
        for g, system in enumerate(prompts)
        for i in range(per_group)
    ]
    rng.shuffle(bodies)
    arrival = 0.0
    requests = []
    for body in bodies:
        requests.append(TimedRequest(arrival_s=arrival, path="/v1/chat/completions", body=body))
        arrival += rng.expovariate(rate_per_s)
    return requests
