"""`LLMClient`: one backend plus what every backend needs alike: retries with backoff, the price of each call,
the run's budget, the call log and the replay of recorded answers.

``ask`` in order:

1. Replay: when ``replay(prompt_hash)`` returns a recorded successful call, its reply is returned at no cost
   and recorded again with ``replayed=True`` (a resumed run asking the same question pays nothing).
2. Budget: when the run's `Budget` is spent, `LLMBudgetExhausted` before anything is sent. A call that
   crosses the limit is let through; the next ``ask`` refuses.
3. Attempts: each one is bounded by ``timeout_s`` in all, connect, first byte and the whole body together (an
   HTTP SDK's own timeout is per read: an endpoint that trickles a byte at a time would hold it without end),
   and said as it starts (``on_start``, and the ``ksearch.llm`` logger). A `TransientLLMError` (429, 5xx,
   timeout...) is retried up to ``retries`` times, waiting an
   exponential backoff with jitter, at least the server's Retry-After; when the endpoint stays down the call
   is recorded with its error and `LLMUnavailable` raised (the run stops cleanly, resumable). Any other
   `LLMError` is recorded and raised at once.
4. Success: cost from the usage and the price table (None for an unpriced model: tokens still count), added
   to the budget, recorded, returned. When the backend reports no usage (command, queue) the client counts the
   text with its `ksearch.llm.tokens` counter (KSEARCH_TOKENIZER: a real tokenizer where one is installed,
   else ~4 characters a token) and records which in `LLMCall.usage_counted_by` (``usage_estimated`` when it
   was the estimate). A truncated reply (finish_reason length / max_tokens) is returned as it
   is, its finish_reason in the record says so (`is_truncated`); the proposer decides what to do. A reply
   longer than `reply_limit` characters is cut there and flagged the same way.

The record never holds the API key: the client has none, and backends take it out of their error texts.
"""

from __future__ import annotations

import contextvars
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable

from ksearch import config
from ksearch.errors import ConfigError, LLMBudgetExhausted, LLMError, LLMUnavailable, TransientLLMError
from ksearch.llm.backends import call_purpose
from ksearch.llm.base import (PROVIDER, TRUNCATED_REASONS, Backend, LLMCall, LLMReply, Message, Role,  # noqa: F401
                              Usage, is_truncated, prompt_hash)
from ksearch.llm.prices import Prices
from ksearch.llm.tokens import CHARS_PER_TOKEN, TokenCounter, count_usage, counter_for


#: the longest reply kept, in characters per token asked for (a token is ~4 characters: 4x headroom), and at
#: least MIN_REPLY_CHARS. A longer reply (a command that prints logs without end, a server that ignores
#: max_tokens) is cut there and flagged truncated, so the run store, the candidates and later prompts stay small.
REPLY_CHARS_PER_TOKEN = 16
MIN_REPLY_CHARS = 65_536

log = logging.getLogger("ksearch.llm")


def bounded(backend: Backend, messages: list[Message], *, model: str, max_tokens: int, temperature: float,
            timeout_s: float) -> LLMReply:
    """``backend.complete(...)``, ended after ``timeout_s`` seconds of wall-clock time in all (connect, first
    byte and the whole body), whatever the backend's own timeout measures.

    A backend whose ``bounds_total_time`` is true (command, queue: a process or a file wait it ends itself) is
    called as it is. Any other runs in a helper thread that this one waits for; past the deadline the backend's
    ``abort()`` (when it has one) closes its connections, the helper is left to end on its own (a daemon thread:
    its late answer is dropped) and `TransientLLMError` is raised, so the client retries or gives up as for any
    timeout.

    Raises:
        TransientLLMError: no complete reply within ``timeout_s``; else what ``complete`` raises.
    """
    kwargs = {"model": model, "max_tokens": max_tokens, "temperature": temperature, "timeout_s": timeout_s}
    if getattr(backend, "bounds_total_time", False):
        return backend.complete(messages, **kwargs)
    box: dict = {}
    done = threading.Event()
    context = contextvars.copy_context()  # call_purpose and the like, as the caller set them

    def attempt() -> None:
        try:
            box["reply"] = context.run(backend.complete, messages, **kwargs)
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread, raised there
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=attempt, name=f"ksearch-llm-{backend.name}", daemon=True).start()
    if not done.wait(timeout_s):
        abort = getattr(backend, "abort", None)
        if callable(abort):
            try:
                abort()
            except Exception:  # noqa: BLE001 - a failed close leaves a daemon thread that ends with the process
                log.debug("llm: closing the %s backend's connections failed", backend.name, exc_info=True)
        raise TransientLLMError(f"{backend.name}: no complete reply within {timeout_s:g} s (the whole call: "
                                "connect, first byte and body)")
    if "error" in box:
        raise box["error"]
    return box["reply"]


def reply_limit(max_tokens: int) -> int:
    """Characters of a reply kept when ``max_tokens`` were asked for."""
    return max(MIN_REPLY_CHARS, REPLY_CHARS_PER_TOKEN * max_tokens)


class Budget:
    """A run's limits on language-model spending and what has been spent so far.

    ``max_cost_usd`` / ``max_tokens``: None for no limit. ``spent_usd`` / ``spent_tokens``: seed them with what
    the run's recorded calls spent (`Budget.from_calls`, or the store's totals) when a run resumes. Calls to an
    unpriced model count their tokens but no dollars (``unpriced_calls`` counts them).
    """

    def __init__(self, max_cost_usd: float | None = None, max_tokens: int | None = None, *,
                 spent_usd: float = 0.0, spent_tokens: int = 0):
        self.max_cost_usd = max_cost_usd
        self.max_tokens = max_tokens
        self.spent_usd = float(spent_usd)
        self.spent_tokens = int(spent_tokens)
        self.unpriced_calls = 0

    @classmethod
    def from_calls(cls, calls: Iterable[LLMCall], max_cost_usd: float | None = None,
                   max_tokens: int | None = None) -> "Budget":
        """A budget seeded with the spending of recorded calls (replays cost nothing)."""
        budget = cls(max_cost_usd, max_tokens)
        for call in calls:
            if not call.replayed:
                budget.add(call.cost_usd, call.usage)
        return budget

    def add(self, cost_usd: float | None, usage: Usage) -> None:
        self.spent_tokens += usage.total
        if cost_usd is None:
            if usage.total:
                self.unpriced_calls += 1
        else:
            self.spent_usd += cost_usd

    def exhausted(self) -> str | None:
        """Why no more calls may be made, or None."""
        if self.max_cost_usd is not None and self.spent_usd >= self.max_cost_usd:
            return (f"the llm cost limit is reached: ${self.spent_usd:.4f} spent of --max-cost "
                    f"${self.max_cost_usd:g} ({self.spent_tokens} tokens)")
        if self.max_tokens is not None and self.spent_tokens >= self.max_tokens:
            return (f"the llm token limit is reached: {self.spent_tokens} tokens spent of --max-tokens "
                    f"{self.max_tokens} (${self.spent_usd:.4f})")
        return None

    def check(self) -> None:
        """Raises LLMBudgetExhausted when the budget is spent."""
        why = self.exhausted()
        if why:
            raise LLMBudgetExhausted(why)

    def __repr__(self) -> str:
        return (f"Budget(max_cost_usd={self.max_cost_usd}, max_tokens={self.max_tokens}, "
                f"spent_usd={self.spent_usd:.6f}, spent_tokens={self.spent_tokens})")


class LLMClient:
    """Retries, prices, budget, call log and replay around one backend (see the module docstring).

    ``record``: called with every `LLMCall` (answered, failed or replayed); ``replay``: a prompt hash to a
    recorded call or None. ``retries``: attempts after the first on transient errors; the wait before retry k
    (1, 2, ...) is ``min(max_backoff_s, backoff_s * 2**(k-1))`` times a jitter factor in [0.5, 1) from ``rng``
    (a `random.Random`; seed it for reproducible waits), and at least the server's Retry-After. A Retry-After
    longer than ``max_retry_after_s`` (a quota, not a blip) ends the retries at once. ``timeout_s``: per
    attempt; ``sleep`` / ``clock``: injectable for tests. ``tokenizer``: what counts the tokens of a call whose
    backend reports none (None: the one KSEARCH_TOKENIZER names, `ksearch.llm.tokens.counter_for`).

    Raises:
        ConfigError: KSEARCH_TOKENIZER names no tokenizer that loads (at construction, not mid-run).
    """

    def __init__(self, backend: Backend, *, prices: Prices | None = None, budget: Budget | None = None,
                 record: Callable[[LLMCall], object] | None = None,
                 replay: Callable[[str], LLMCall | None] | None = None, retries: int = 4, backoff_s: float = 1.0,
                 max_backoff_s: float = 30.0, timeout_s: float = 120.0, temperature: float = 0.2,
                 sleep: Callable[[float], object] = time.sleep, clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None, max_retry_after_s: float = 300.0,
                 tokenizer: TokenCounter | None = None, on_start: Callable[[str], object] | None = None):
        self.backend = backend
        self.on_start = on_start
        self.tokenizer = tokenizer if tokenizer is not None else counter_for(config.tokenizer_setting())
        self.prices = prices if prices is not None else Prices.load()
        self.budget = budget if budget is not None else Budget()
        self.record = record
        self.replay = replay
        self.retries = max(0, int(retries))
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.timeout_s = timeout_s
        self.temperature = temperature
        self.sleep = sleep
        self.clock = clock
        self.rng = rng if rng is not None else random.Random()
        self.max_retry_after_s = max_retry_after_s

    # -- the call ---------------------------------------------------------------------------------------

    def ask(self, role: Role, purpose: str, messages: list[Message], *, model: str, max_tokens: int = 4096,
            node_id: str | None = None) -> LLMReply:
        """One logical call (see the module docstring).

        Raises:
            LLMBudgetExhausted: the budget was spent before this call.
            LLMUnavailable: the endpoint stayed down through every retry (the call is recorded).
            LLMError: a failure a retry will not cure (bad key, unknown model, a command that failed; recorded).
            ConfigError: --max-cost is set but ``model`` has no price (its spending could not be limited).
        """
        messages = list(messages)
        h = prompt_hash(messages, model)
        base = {"role": role, "purpose": purpose, "backend": self.backend.name, "model": model,
                "node_id": node_id, "messages": messages, "prompt_hash": h}

        replayed = self._replayed(h)
        if replayed is not None:
            self._record(LLMCall(**base, reply=replayed.reply, finish_reason=replayed.finish_reason,
                                 usage=Usage(), latency_s=0.0, cost_usd=0.0, attempts=0, replayed=True))
            return LLMReply(text=replayed.reply or "", usage=Usage(), model=replayed.model,
                            finish_reason=replayed.finish_reason, latency_s=0.0)

        self.budget.check()
        if self.budget.max_cost_usd is not None and self.backend.name in ("openai", "anthropic") and \
                self.prices.lookup(model) is None:
            raise ConfigError(f"--max-cost is set but the model {model!r} has no price, so its spending cannot be "
                              "limited: give its price in a --prices file (0 for a free local endpoint) or drop "
                              "--max-cost (--max-tokens still limits it)")

        started = self.clock()
        attempts = 0
        last: TransientLLMError | None = None
        reply: LLMReply | None = None
        token = call_purpose.set(purpose)
        try:
            while True:
                attempts += 1
                t0 = self.clock()
                self._started(role, purpose, model, attempts)
                try:
                    reply = bounded(self.backend, messages, model=model, max_tokens=max_tokens,
                                    temperature=self.temperature, timeout_s=self.timeout_s)
                except TransientLLMError as e:
                    last = e
                    wait = self._wait(attempts, e.retry_after_s) if attempts <= self.retries else None
                    if wait is None:
                        break
                    self.sleep(wait)
                    continue
                except LLMError as e:
                    text = self._redact(str(e))
                    self._record(LLMCall(**base, error=text, attempts=attempts,
                                         latency_s=max(0.0, self.clock() - started)))
                    raise
                break
        finally:
            call_purpose.reset(token)

        if reply is None:
            assert last is not None
            self._down(base, attempts, last, started)

        latency = reply.latency_s if reply.latency_s > 0 else max(0.0, self.clock() - t0)
        limit = reply_limit(max_tokens)
        counted_by = PROVIDER
        if reply.usage.total == 0:  # command and queue backends report none: counted here, and said by what
            usage = count_usage(self.tokenizer, messages, reply.text[:limit])
            if len(reply.text) > limit:  # what is cut below is paid for too: estimated, not tokenized (bounded work)
                usage = usage.model_copy(update={"output_tokens": usage.output_tokens + round(
                    (len(reply.text) - limit) / CHARS_PER_TOKEN)})
            reply = reply.model_copy(update={"usage": usage})
            counted_by = self.tokenizer.name
        if len(reply.text) > limit:  # counted whole above, kept cut (and flagged as cut) from here on
            reply = reply.model_copy(update={"text": reply.text[:limit], "finish_reason": "length"})
        cost = self.prices.cost(model, reply.usage)
        if cost is None and reply.model and reply.model != model:
            cost = self.prices.cost(reply.model, reply.usage)
        self.budget.add(cost, reply.usage)
        self._record(LLMCall(**base, reply=reply.text, finish_reason=reply.finish_reason, usage=reply.usage,
                             usage_counted_by=counted_by, latency_s=latency, cost_usd=cost, attempts=attempts))
        return reply.model_copy(update={"latency_s": latency})

    # -- helpers ----------------------------------------------------------------------------------------

    def _down(self, base: dict, attempts: int, last: TransientLLMError, started: float) -> None:
        why = self._redact(str(last))
        if last.retry_after_s is not None and last.retry_after_s > self.max_retry_after_s:
            why += f" (the server asks to wait {last.retry_after_s:g} s)"
        self._record(LLMCall(**base, error=f"stayed down after {attempts} attempts: {why}", attempts=attempts,
                             latency_s=max(0.0, self.clock() - started)))
        raise LLMUnavailable(f"the {self.backend.name} endpoint ({base['model']}) stayed down after {attempts} "
                             f"attempts: last error: {why}")

    def _started(self, role: str, purpose: str, model: str, attempt: int) -> None:
        line = (f"llm {role} {purpose}: asking {self.backend.name} {model}"
                + (f" (attempt {attempt})" if attempt > 1 else "") + f", up to {self.timeout_s:g} s")
        log.info(line)
        if self.on_start is not None:
            self.on_start(line)

    def _wait(self, attempt: int, retry_after: float | None) -> float | None:
        """Seconds to wait before retry number ``attempt``; None to stop retrying."""
        backoff = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
        wait = backoff * (0.5 + 0.5 * self.rng.random())
        if retry_after is not None:
            if retry_after > self.max_retry_after_s:
                return None
            wait = max(wait, retry_after)
        return wait

    def _replayed(self, h: str) -> LLMCall | None:
        if self.replay is None:
            return None
        old = self.replay(h)
        if old is None or old.error is not None or old.reply is None:
            return None
        return old

    def _redact(self, text: str) -> str:
        redact = getattr(self.backend, "redact", None)
        return redact(text) if callable(redact) else text

    def _record(self, call: LLMCall) -> None:
        if self.record is not None:
            self.record(call)
