"""A request's leading token ids, as the engine will see them (for ``hashing``).

The engine's own Hugging Face tokenizer (``transformers.AutoTokenizer``, from the model's
name or folder, ``--tokenizer``, at the engine's ``--revision`` on the Hub) turns the body
into tokens the way vLLM's OpenAI server does with its default tokenizer and chat template
(the operator refuses engine flags that change them while ``router.kvEvents`` is on):

- ``/v1/completions``: a token-id prompt as it is; a text prompt (the first of a batch)
  encoded with ``add_special_tokens`` (the request's field, default true).
- ``/v1/chat/completions``: the tokenizer's chat template rendered with the ``messages``,
  ``tools``, ``add_generation_prompt`` (default true), ``continue_final_message`` and
  ``chat_template_kwargs`` of the request, then encoded with ``add_special_tokens`` (default
  false). List content is its text parts joined by newlines, as vLLM renders it for a
  template that takes strings; a message with any other part (an image) gives no tokens.

**Bound**: only the first ``max_tokens`` tokens matter (the hashed depth). Text longer than
``max_tokens * CHARS_PER_TOKEN_BOUND`` characters is cut there before encoding, and the
tokens that end within ``CUT_MARGIN_CHARS`` of the cut are dropped (a word cut in two
encodes differently), as are special tokens the tokenizer appends at the end. Cost: one
encoding of at most that many characters (plus one template rendering for chat).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from prefixserving.router.prefix_hashing import first_prompt

log = logging.getLogger(__name__)

CHARS_PER_TOKEN_BOUND = 8
CUT_MARGIN_CHARS = 64


def _text_content(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(part, Mapping) and part.get("type") == "text" for part in content
    ):
        return "\n".join(str(part.get("text", "")) for part in content)
    return None


class RequestTokenizer:
    """Leading token ids of request bodies with the engine's tokenizer (module docstring)."""

    def __init__(self, tokenizer: str, max_tokens: int, revision: str | None = None) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer, revision=revision)
        self.max_tokens = max_tokens

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        """The first tokens of ``text`` (at most ``max_tokens``, see the bound)."""
        limit = self.max_tokens * CHARS_PER_TOKEN_BOUND
        if len(text) <= limit:
            ids = self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]
            return list(ids[: self.max_tokens])
        encoded = self.tokenizer(
            text[:limit],
            add_special_tokens=add_special_tokens,
            return_offsets_mapping=True,
            return_special_tokens_mask=True,
        )
        safe_end = limit - CUT_MARGIN_CHARS
        ids: list[int] = []
        for token, (_, end), special in zip(
            encoded["input_ids"],
            encoded["offset_mapping"],
            encoded["special_tokens_mask"],
            strict=True,
        ):
            if special and ids:  # a special token after text: the appended end marker
                break
            if not special and end > safe_end:
                break
            ids.append(token)
        return ids[: self.max_tokens]

    def completion(self, body: Mapping[str, Any]) -> Sequence[int] | None:
        """Leading tokens of a ``/v1/completions`` body."""
        prompt = first_prompt(body.get("prompt", ""))
        if isinstance(prompt, list):
            return prompt[: self.max_tokens]
        return self.encode(prompt, bool(body.get("add_special_tokens", True)))

    def chat(self, body: Mapping[str, Any]) -> Sequence[int] | None:
        """Leading tokens of a ``/v1/chat/completions`` body; None for content the router
        cannot render (images) or a template that fails."""
        messages = []
        for message in body.get("messages", []):
            content = _text_content(message.get("content"))
            if content is None and message.get("content") is not None:
                return None
            messages.append({**message, "content": content})
        try:
            text = self.tokenizer.apply_chat_template(
                messages,
                tools=body.get("tools"),
                add_generation_prompt=bool(body.get("add_generation_prompt", True)),
                continue_final_message=bool(body.get("continue_final_message", False)),
                tokenize=False,
                **dict(body.get("chat_template_kwargs") or {}),
            )
        except Exception as error:  # the engine answers the request; the router only routes
            log.debug("chat template failed, no cached blocks for this request: %s", error)
            return None
        return self.encode(str(text), bool(body.get("add_special_tokens", False)))

    def tokens(self, body: Mapping[str, Any]) -> Sequence[int] | None:
        """Leading tokens of a chat (``messages``) or completion body."""
        return self.chat(body) if "messages" in body else self.completion(body)
