"""The contract between the llm proposer and the model backends, as plain records.

A `Backend` turns a list of `Message` into one `LLMReply` (text, token usage, latency) or raises:
`ksearch.errors.TransientLLMError` for what a retry may cure (HTTP 429, 5xx, timeouts, connection resets),
`ksearch.errors.LLMError` for what it will not (401, a bad request, an unknown model). Backends do no retrying, pricing or logging: the
`ksearch.llm.client.LLMClient` wraps one backend with those, so every backend gets them alike.

Every call the client makes, answered or not, becomes one `LLMCall` record: the run store keeps them
(`ksearch show RUN --llm`), and a resumed run replays a recorded reply to the same prompt instead of paying
for it again.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

Role = Literal["planner", "coder"]

#: `LLMCall.usage_counted_by` of tokens the provider reported, and of tokens estimated from the text length
PROVIDER, ESTIMATE = "provider", "estimate"

#: finish reasons that mean the reply was cut at the token limit (OpenAI-compatible "length", Anthropic
#: "max_tokens", "model_context_window_exceeded")
TRUNCATED_REASONS = frozenset({"length", "max_tokens", "model_context_window_exceeded"})


def is_truncated(finish_reason: str | None) -> bool:
    """True when the provider stopped the reply at a token limit."""
    return (finish_reason or "") in TRUNCATED_REASONS


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Message(_Record):
    """One chat message. ``role``: system | user | assistant."""

    role: Literal["system", "user", "assistant"]
    content: str


class Usage(_Record):
    """Tokens of one call (0 when nothing was reported or counted).

    ``input_tokens``: every prompt token, cached or not; ``cache_read_tokens`` and ``cache_write_tokens`` are
    PART of it: the prompt tokens read from the provider's prompt cache (Anthropic's
    ``cache_read_input_tokens``, OpenAI's ``prompt_tokens_details.cached_tokens``) and those written to it
    (Anthropic's ``cache_creation_input_tokens``; OpenAI reports none). Uncached input is ``input_tokens -
    cache_read_tokens - cache_write_tokens`` (`uncached_input_tokens`). ``output_tokens``: the reply's, reasoning
    tokens included.

    Raises:
        pydantic.ValidationError: a count is negative, or the cached tokens exceed ``input_tokens``.
    """

    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    cache_read_tokens: int = Field(default=0, ge=0)
    cache_write_tokens: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _cached_within_input(self) -> "Usage":
        if self.cache_read_tokens + self.cache_write_tokens > self.input_tokens:
            raise ValueError(f"cached tokens ({self.cache_read_tokens} read + {self.cache_write_tokens} written) "
                             f"are part of input_tokens ({self.input_tokens}) and cannot exceed it")
        return self

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def uncached_input_tokens(self) -> int:
        """Prompt tokens neither read from nor written to a cache."""
        return self.input_tokens - self.cache_read_tokens - self.cache_write_tokens


class LLMReply(_Record):
    """A backend's answer. ``finish_reason``: the provider's stop reason when it gave one ("length" or
    "max_tokens" marks a truncated reply); ``latency_s``: wall seconds of the successful attempt."""

    text: str
    usage: Usage = Field(default_factory=Usage)
    model: str = ""
    finish_reason: str | None = None
    latency_s: float = 0.0


class Backend(Protocol):
    """One way to reach a model. ``name``: openai | anthropic | command | queue."""

    name: str

    def complete(self, messages: list[Message], *, model: str, max_tokens: int, temperature: float,
                 timeout_s: float) -> LLMReply:
        """One attempt. Raises TransientLLMError (retry may help) or LLMError (it will not)."""


class LLMCall(_Record):
    """One logical call as the run store keeps it (the last attempt's outcome; ``attempts`` counts retries).

    ``purpose``: what the proposer asked for (e.g. "plan:initial", "plan:refine", "plan:failure",
    "code:first", "code:debug", "code:improve"); ``prompt_hash``: `prompt_hash` of the messages and model;
    ``usage_counted_by``: who gave ``usage``: "provider" (the API's own counts), or, for a backend that reports
    none (command, queue), the tokenizer the client counted the text with (`ksearch.llm.tokens`:
    "tiktoken:o200k_base", "hf:<path>") or "estimate" (~4 characters a token); ``usage_estimated``: True
    exactly when it is "estimate" (a record that gives only one of the two gets the other from it: calls stored
    before ``usage_counted_by`` existed load as "estimate" or "provider"); ``cost_usd``: from the price table,
    None when the model has no price; ``replayed``: the reply came from the run's own log (a resumed run asking
    the same question), nothing was paid.

    Raises:
        pydantic.ValidationError: ``usage_estimated`` contradicts ``usage_counted_by``.
    """

    role: Role
    purpose: str
    backend: str
    model: str
    node_id: str | None = None
    messages: list[Message]
    prompt_hash: str
    reply: str | None = None
    finish_reason: str | None = None
    usage: Usage = Field(default_factory=Usage)
    usage_counted_by: str = PROVIDER
    usage_estimated: bool = False
    latency_s: float = 0.0
    cost_usd: float | None = None
    attempts: int = 1
    error: str | None = None
    replayed: bool = False

    @model_validator(mode="before")
    @classmethod
    def _one_from_the_other(cls, data: Any) -> Any:
        if isinstance(data, dict):
            if "usage_counted_by" not in data and data.get("usage_estimated"):
                data = {**data, "usage_counted_by": ESTIMATE}
            elif "usage_estimated" not in data and data.get("usage_counted_by") == ESTIMATE:
                data = {**data, "usage_estimated": True}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> "LLMCall":
        if self.usage_estimated != (self.usage_counted_by == ESTIMATE):
            raise ValueError(f"usage_estimated={self.usage_estimated} contradicts usage_counted_by="
                             f"{self.usage_counted_by!r} (estimated means counted by {ESTIMATE!r})")
        return self


def prompt_hash(messages: list[Message], model: str) -> str:
    """sha256 over the model and the messages (role and content), hex."""
    blob = json.dumps({"model": model, "messages": [[m.role, m.content] for m in messages]}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()
