"""How a run reaches its models: the ``llm`` proposer's settings, saved with the run (never a key).

Keys are looked up when a run starts or resumes (`ksearch.llm.keys`), from the environment or the config
file; the run store holds only the name of the variable to read, if one was given.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

BackendKind = Literal["openai", "anthropic", "command", "queue"]
ContextLevel = Literal["none", "hardware", "full"]


class LLMSettings(BaseModel):
    """The llm proposer's configuration.

    ``backend``: openai (any OpenAI-compatible endpoint: OpenAI, Gemini's compatible endpoint, vLLM, Ollama,
    llama.cpp's server, OpenRouter), anthropic, command (pipe each prompt to a program, read its stdout) or
    queue (write each prompt to ``queue_dir`` and wait for the reply file). ``model``: the default model;
    ``planner_model`` / ``coder_model`` override it per role. ``context``: what the prompts carry (none: the
    task; hardware: + the hardware spec; full: + the knowledge pack and the world-model view).
    ``max_cost_usd`` / ``max_tokens``: the run stops cleanly (resumable) when its calls have spent this much.
    ``timeout_s``: per call attempt, in all: connect, first byte and whole body (a queue waits this long for a reply
    file); ``retries``: attempts after the first on 429, 5xx and timeouts.
    """

    model_config = ConfigDict(extra="forbid")

    backend: BackendKind = "openai"
    model: str = ""
    planner_model: str | None = None
    coder_model: str | None = None
    base_url: str | None = None
    api_key_env: str | None = Field(default=None, description="name of the environment variable holding the key")
    command: str | None = None
    queue_dir: str | None = None
    context: ContextLevel = "full"
    max_cost_usd: float | None = Field(default=None, gt=0)
    max_tokens: int | None = Field(default=None, gt=0)
    timeout_s: float = Field(default=300.0, gt=0)
    retries: int = Field(default=4, ge=0)
    temperature: float = Field(default=0.2, ge=0)
    prices_file: str | None = None

    @model_validator(mode="after")
    def _complete(self) -> "LLMSettings":
        if self.backend in ("openai", "anthropic") and not (self.model or (self.planner_model and self.coder_model)):
            raise ValueError(f"the {self.backend} backend needs --model (or both --planner-model and --coder-model)")
        if self.backend == "command" and not self.command:
            raise ValueError("the command backend needs --command (the program that answers a prompt on stdin)")
        if self.backend == "queue" and not self.queue_dir:
            raise ValueError("the queue backend needs --queue-dir (where prompts are written and replies read)")
        return self

    @property
    def planner(self) -> str:
        return self.planner_model or self.model or self.backend

    @property
    def coder(self) -> str:
        return self.coder_model or self.model or self.backend


def infer_backend(model: str | None, base_url: str | None) -> BackendKind:
    """anthropic for Claude models on Anthropic's API (no base URL, or one at anthropic.com), else openai."""
    if base_url and "anthropic.com" in base_url:
        return "anthropic"
    if not base_url and model and model.startswith("claude"):
        return "anthropic"
    return "openai"
