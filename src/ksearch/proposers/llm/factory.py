"""Build the llm proposer of a run from its saved `LLMSettings` and its store.

One `LLMClient` serves the planner and the coder (their models may differ: the model is per call). Its call
log goes to the run store; a resumed run replays the answers the run already paid for, in the order it got
them (`StoreReplay`), so resuming after a stop repeats no paid call that was answered.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING

from ksearch.errors import ConfigError
from ksearch.llm.base import LLMCall
from ksearch.llm.settings import LLMSettings

if TYPE_CHECKING:
    from ksearch.hardware.spec import HardwareSpec
    from ksearch.proposers.llm.proposer import LLMProposer
    from ksearch.search.strategy import StrategyConfig
    from ksearch.store.db import Store
    from ksearch.tasks.loader import Task


class StoreReplay:
    """``replay(prompt_hash)`` for `LLMClient`: the answers the run had paid for when this process opened it,
    per prompt in the order they came; the n-th ask of a prompt here gets the n-th of them, and None once they
    are used up (the question then goes out). Calls made by this process are never replayed to it."""

    def __init__(self, store: Store | None):
        self.answers: dict[str, list[LLMCall]] = defaultdict(list)
        for call in (store.llm_calls() if store is not None else []):
            if call.error is None and call.reply is not None and not call.replayed:
                self.answers[call.prompt_hash].append(call)

    def __call__(self, prompt_hash: str) -> LLMCall | None:
        queue = self.answers.get(prompt_hash)
        return queue.pop(0) if queue else None


def build_llm_proposer(task: Task, target: str, hardware: HardwareSpec | None, settings: LLMSettings,
                       store: Store | None = None, strategy: StrategyConfig | None = None,
                       workloads: list[str] | None = None,
                       progress: Callable[[str], object] | None = None) -> LLMProposer:
    """The `LLMProposer` for a run (``store``: its call log, replays and the evidence the coder's debug prompts
    quote; ``strategy``: the run's StrategyConfig; ``workloads``: the run's selection, None for all; ``progress``:
    told each call as it starts). Raises ConfigError (ksearch.errors) for a missing key, command
    or queue directory, an unreadable price table, or a --max-cost on a model without a price."""
    from ksearch.llm.backends import make_backend
    from ksearch.llm.client import Budget, LLMClient
    from ksearch.llm.prices import Prices
    from ksearch.proposers.llm.proposer import LLMProposer

    prices = Prices.load(settings.prices_file)
    if settings.max_cost_usd is not None:  # refused here, before a run exists, not at its first call
        unpriced = [m for m in dict.fromkeys((settings.planner, settings.coder)) if prices.lookup(m) is None]
        if unpriced:
            names = " and ".join(repr(m) for m in unpriced)
            if settings.backend in ("command", "queue"):
                raise ConfigError(f"--max-cost cannot limit the {settings.backend} backend: it reports no cost and "
                                  f"the model {names} has no price; use --max-tokens (tokens are counted by the "
                                  "tokenizer KSEARCH_TOKENIZER names, else estimated from the text), or give the "
                                  "model's price in a --prices file")
            raise ConfigError(f"--max-cost is set but the model {names} has no price, so its spending cannot be "
                              "limited: give its price in a --prices file (0 for a free local endpoint) or drop "
                              "--max-cost (--max-tokens still limits it)")
    backend = make_backend(settings.backend, base_url=settings.base_url, command=settings.command,
                           queue_dir=settings.queue_dir, api_key_env=settings.api_key_env)
    calls = store.llm_calls() if store is not None else []
    budget = Budget.from_calls(calls, max_cost_usd=settings.max_cost_usd, max_tokens=settings.max_tokens)
    client = LLMClient(backend, prices=prices, budget=budget,
                       record=store.record_llm_call if store is not None else None, replay=StoreReplay(store),
                       retries=settings.retries, timeout_s=settings.timeout_s, temperature=settings.temperature,
                       on_start=progress)
    return LLMProposer(task, target, hardware, planner=client, coder=client, planner_model=settings.planner,
                       coder_model=settings.coder, context=settings.context, evidence=store, strategy=strategy,
                       workloads=workloads)
