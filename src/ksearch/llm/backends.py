"""The four ways to reach a model, each one `ksearch.llm.base.Backend`: one attempt per `complete` call, no
retrying, pricing or logging (that is `ksearch.llm.client.LLMClient`'s job).

- `OpenAIBackend`: any OpenAI-compatible chat-completions endpoint (OpenAI, Gemini's compatible endpoint,
  vLLM, Ollama, llama.cpp's server, OpenRouter) through the openai SDK.
- `AnthropicBackend`: Anthropic's Messages API through the anthropic SDK.

Prompt caching: a run's system prompt (role, protocol, task, hardware, knowledge pack) is the same on every call
of a role, and the changing part follows it. Anthropic caches it where asked (`AnthropicBackend` marks the last
system block ``cache_control: ephemeral``); OpenAI caches a prompt's prefix by itself (from 1024 tokens on) and
Gemini's 2.5 models likewise. Both backends record what the provider says it read from (and wrote to) its cache
in `Usage.cache_read_tokens` / `Usage.cache_write_tokens`, which the price table charges at their own rates.
- `CommandBackend`: pipe the prompt to a program (a coding-agent CLI, a script) and read its stdout.
- `QueueBackend`: write the prompt to a directory and wait for a reply file (a person, or any other program).

Errors: what a retry may cure (HTTP 408, 429, 5xx, timeouts, connection errors, a garbled body) is
`TransientLLMError`, with the server's Retry-After when it sent one; the rest (401, 403, 404, 400: a bad key,
an unknown model, a bad request; a command that exits non-zero) is `LLMError` with the HTTP status and the
server's message. Neither ever carries the API key.

The queue's file protocol
-------------------------
One run per directory. For each call the backend writes, each file atomically (a temporary name, then a
rename), first ``NNNN-<purpose>.json`` and then ``NNNN-<purpose>.prompt.md``:

- ``NNNN``: 0001, 0002, ... one more than the highest number in the directory; ``<purpose>``: what the
  proposer asks for, e.g. ``plan-initial`` or ``code-debug`` (``call`` when unknown).
- ``.prompt.md``: the prompt as plain text, one ``=== system ===`` / ``=== user ===`` / ``=== assistant ===``
  header per message, below a comment naming the model, the token limit and the reply file to write.
- ``.json``: ``{"seq", "purpose", "model", "max_tokens", "temperature", "prompt_hash", "messages": [{"role",
  "content"}], "reply_file", "created_at", "consumed"}``, for programs.

The answerer writes the reply text to ``NNNN-<purpose>.reply.md`` (best by writing another name and renaming;
otherwise the backend waits until the file is non-empty and unchanged for one poll interval). The backend
polls for it until its timeout (then `TransientLLMError`: the client asks again, which waits on the same
files), reads it, and sets ``"consumed": true`` in the ``.json``. A prompt not yet consumed is reused when the
same question (same prompt hash) is asked again, so a run stopped while waiting picks up the reply on resume.
"""

from __future__ import annotations

import email.utils
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
from contextvars import ContextVar
from datetime import datetime, timezone
from pathlib import Path

from ksearch.errors import ConfigError, LLMError, TransientLLMError
from ksearch.llm.base import Backend, LLMReply, Message, Usage, prompt_hash

#: What the current call is for (the proposer's ``purpose``), set by the client around each backend call; the
#: queue names its files after it and the command backend passes it on as ``KSEARCH_LLM_PURPOSE``.
call_purpose: ContextVar[str | None] = ContextVar("ksearch_llm_call_purpose", default=None)

#: HTTP statuses a retry may cure
_TRANSIENT_STATUS = {408, 429}
_MESSAGE_CHARS = 500
_STDERR_CHARS = 2000


def render_plain(messages: list[Message]) -> str:
    """The messages as plain text, one ``=== role ===`` header per message (the command and queue backends)."""
    return "\n\n".join(f"=== {m.role} ===\n{m.content.rstrip()}" for m in messages) + "\n"


class _Redactor:
    """Replaces a secret (the API key) in any text bound for a message."""

    def __init__(self, secret: str | None):
        self._secret = secret if secret and len(secret) >= 4 else None

    def __call__(self, text: str) -> str:
        return text.replace(self._secret, "[api key]") if self._secret else text


def _retry_after(headers) -> float | None:
    """Seconds from ``retry-after-ms`` or ``retry-after`` (seconds or an HTTP date); None when absent."""
    if headers is None:
        return None
    for name, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) * scale
        except ValueError:
            try:
                seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
            except (TypeError, ValueError, IndexError, OverflowError):
                continue
        if math.isfinite(seconds):
            return max(0.0, seconds)
    return None


def _server_message(exc) -> str:
    """The server's own words from an SDK status error: ``error.message`` of the body, else the SDK's text."""
    body = getattr(exc, "body", None)
    if isinstance(body, list) and body:  # Gemini's compatible endpoint wraps errors in a list
        body = body[0]
    msg = None
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            msg = err.get("message")
        elif isinstance(err, str):
            msg = err
    if not isinstance(msg, str) or not msg.strip():
        msg = getattr(exc, "message", None) or str(exc)
    msg = " ".join(msg.split())
    return msg[:_MESSAGE_CHARS] + ("..." if len(msg) > _MESSAGE_CHARS else "")


def _map_sdk_error(exc: Exception, sdk, name: str, timeout_s: float, redact) -> LLMError:
    """An openai / anthropic SDK exception as TransientLLMError (retry may help) or LLMError (it will not)."""
    if isinstance(exc, sdk.APITimeoutError):
        return TransientLLMError(f"{name}: no reply within {timeout_s:g} s (timeout)")
    if isinstance(exc, sdk.APIConnectionError):
        cause = exc.__cause__ or exc.__context__
        why = f"{type(cause).__name__}: {cause}" if cause is not None else exc.message
        return TransientLLMError(redact(f"{name}: connection failed: {why}"[:_MESSAGE_CHARS]))
    if isinstance(exc, sdk.APIStatusError):
        status = exc.status_code
        text = redact(f"{name}: HTTP {status}: {_server_message(exc)}")
        if status in _TRANSIENT_STATUS or status >= 500:
            return TransientLLMError(text, retry_after_s=_retry_after(exc.response.headers))
        return LLMError(text)
    if isinstance(exc, sdk.APIResponseValidationError):
        return TransientLLMError(redact(f"{name}: garbled reply (HTTP {exc.status_code}): {exc.message}"))
    return LLMError(redact(f"{name}: {type(exc).__name__}: {exc}"[:_MESSAGE_CHARS]))


def _garbled(name: str, what: str, detail: object = "") -> TransientLLMError:
    detail = " ".join(str(detail).split())[:200]
    return TransientLLMError(f"{name}: garbled reply: {what}" + (f" ({detail})" if detail else ""))


def _count(value) -> int:
    """A token count from a usage field that may be missing, None or nonsense."""
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError):
        return 0


def _field(obj, name: str):
    """``obj.name`` or ``obj[name]`` (an SDK model, or a dict the SDK left unparsed); None when neither."""
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


def _openai_cached(usage) -> int:
    """``usage.prompt_tokens_details.cached_tokens`` (OpenAI's prompt cache); 0 where a compatible server sends no
    details, null, or something else."""
    return _count(_field(_field(usage, "prompt_tokens_details"), "cached_tokens"))


def _is_openai_api(base_url: str | None) -> bool:
    from ksearch.llm.keys import provider_of

    return provider_of("openai", base_url) == "openai"


def _fixed_temperature(model: str) -> bool:
    """OpenAI's reasoning models (o1, o3, o4-mini, gpt-5...) refuse any temperature but the default."""
    bare = model.rsplit("/", 1)[-1]
    return bool(re.match(r"(o\d|gpt-5)", bare))


def _swap_client(backend) -> None:
    """A new SDK client for ``backend`` and the old one closed: a call cut at its deadline (in another thread, whose
    socket the close ends) leaves no connection behind, and the next call does not queue behind it."""
    old, backend._client = backend._client, backend._new_client()
    old.close()


class OpenAIBackend:
    """An OpenAI-compatible chat-completions endpoint. ``base_url``: None for OpenAI's API, else e.g.
    ``http://localhost:8000/v1`` (vLLM), ``http://localhost:11434/v1`` (Ollama),
    ``https://generativelanguage.googleapis.com/v1beta/openai/`` (Gemini), ``https://openrouter.ai/api/v1``."""

    name = "openai"

    def __init__(self, base_url: str | None = None, api_key: str | None = None):
        import openai

        self.base_url = base_url
        self._sdk = openai
        self.redact = _Redactor(api_key)
        # OpenAI's own API wants max_completion_tokens (its reasoning models refuse max_tokens); compatible
        # servers (vLLM, Ollama, llama.cpp, Gemini, OpenRouter) all know max_tokens
        self._completion_tokens_param = "max_completion_tokens" if _is_openai_api(base_url) else "max_tokens"
        self._new_client = lambda: openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        try:
            self._client = self._new_client()
        except openai.OpenAIError as e:
            raise ConfigError(self.redact(f"openai backend: {e}")) from None

    def abort(self) -> None:
        """Close the connections of a call cut at its deadline (`ksearch.llm.client.bounded`); the next call gets
        a new client."""
        _swap_client(self)

    def __repr__(self) -> str:
        return f"OpenAIBackend(base_url={self.base_url!r})"

    def complete(self, messages: list[Message], *, model: str, max_tokens: int, temperature: float,
                 timeout_s: float) -> LLMReply:
        kwargs: dict = {"model": model, "messages": [{"role": m.role, "content": m.content} for m in messages],
                        self._completion_tokens_param: max_tokens, "timeout": timeout_s}
        if not _fixed_temperature(model):
            kwargs["temperature"] = temperature
        t0 = time.monotonic()
        try:
            resp = self._client.chat.completions.create(**kwargs)
        except self._sdk.OpenAIError as e:
            raise _map_sdk_error(e, self._sdk, self.name, timeout_s, self.redact) from None
        except ValueError as e:  # a 200 whose body is not JSON, or JSON of the wrong shape
            raise _garbled(self.name, "the body is not a chat completion", self.redact(str(e))) from None
        latency = time.monotonic() - t0
        choices = getattr(resp, "choices", None)
        if not isinstance(choices, list) or not choices:
            what = "no choices" if isinstance(choices, list) else "the body is not a chat completion"
            raise _garbled(self.name, what, self.redact(str(resp)))
        choice = choices[0]
        message = getattr(choice, "message", None)
        text = getattr(message, "content", None)
        if not isinstance(text, str):
            refusal = getattr(message, "refusal", None)
            text = refusal if isinstance(refusal, str) else ""
        usage = getattr(resp, "usage", None)
        finish = getattr(choice, "finish_reason", None)
        inp = _count(getattr(usage, "prompt_tokens", 0))
        return LLMReply(text=text,
                        usage=Usage(input_tokens=inp, output_tokens=_count(getattr(usage, "completion_tokens", 0)),
                                    cache_read_tokens=min(inp, _openai_cached(usage))),
                        model=str(getattr(resp, "model", None) or model),
                        finish_reason=str(finish) if finish is not None else None, latency_s=latency)


class AnthropicBackend:
    """Anthropic's Messages API. System messages go to ``system=`` as text blocks, one per message, the last
    marked ``cache_control: {"type": "ephemeral"}`` (Anthropic's prompt caching: the system prompt is written to a
    5-minute cache on the first call and read from it on the next ones of the run; a prompt shorter than the
    model's minimum, a thousand tokens or more by model, is not cached, without error). Usage: ``input_tokens`` is the sum of the
    uncached, cache-read and cache-written prompt tokens, the last two also in ``cache_read_tokens`` /
    ``cache_write_tokens``. ``temperature`` is not sent: the Messages API of the SDK in use (anthropic 2.x) has
    no sampling parameters."""

    name = "anthropic"

    def __init__(self, base_url: str | None = None, api_key: str | None = None):
        import anthropic

        self.base_url = base_url
        self._sdk = anthropic
        self.redact = _Redactor(api_key)
        self._new_client = lambda: anthropic.Anthropic(base_url=base_url, api_key=api_key, max_retries=0)
        try:
            self._client = self._new_client()
        except anthropic.AnthropicError as e:
            raise ConfigError(self.redact(f"anthropic backend: {e}")) from None

    def abort(self) -> None:
        """As `OpenAIBackend.abort`."""
        _swap_client(self)

    def __repr__(self) -> str:
        return f"AnthropicBackend(base_url={self.base_url!r})"

    def complete(self, messages: list[Message], *, model: str, max_tokens: int, temperature: float,
                 timeout_s: float) -> LLMReply:
        system: list[dict] = [{"type": "text", "text": m.content} for m in messages
                              if m.role == "system" and m.content]
        chat = [{"role": m.role, "content": m.content} for m in messages if m.role != "system"]
        if not chat:
            raise LLMError("anthropic: a call needs at least one user message besides the system prompt")
        kwargs: dict = {"model": model, "messages": chat, "max_tokens": max_tokens, "timeout": timeout_s}
        if system:
            system[-1]["cache_control"] = {"type": "ephemeral"}
            kwargs["system"] = system
        t0 = time.monotonic()
        try:
            resp = self._client.messages.create(**kwargs)
        except self._sdk.AnthropicError as e:
            raise _map_sdk_error(e, self._sdk, self.name, timeout_s, self.redact) from None
        except ValueError as e:
            raise _garbled(self.name, "the body is not a message", self.redact(str(e))) from None
        latency = time.monotonic() - t0
        content = getattr(resp, "content", None)
        if not isinstance(content, list):
            raise _garbled(self.name, "the body is not a message", self.redact(str(resp)))
        text = "".join(getattr(b, "text", "") or "" for b in content if getattr(b, "type", None) == "text")
        usage = getattr(resp, "usage", None)
        read = _count(getattr(usage, "cache_read_input_tokens", 0))
        written = _count(getattr(usage, "cache_creation_input_tokens", 0))
        inp = _count(getattr(usage, "input_tokens", 0)) + read + written
        stop = getattr(resp, "stop_reason", None)
        return LLMReply(text=text,
                        usage=Usage(input_tokens=inp, output_tokens=_count(getattr(usage, "output_tokens", 0)),
                                    cache_read_tokens=read, cache_write_tokens=written),
                        model=str(getattr(resp, "model", None) or model),
                        finish_reason=str(stop) if stop is not None else None, latency_s=latency)


class CommandBackend:
    """Pipe each prompt (`render_plain`) to a program's stdin; its stdout is the reply.

    ``command``: split like a shell would (`shlex.split`) but run without one; ``{model}`` in it becomes the
    call's model. The program runs in its own process group with this process's environment plus
    ``KSEARCH_LLM_MODEL``, ``KSEARCH_LLM_MAX_TOKENS`` and ``KSEARCH_LLM_PURPOSE``. A timeout or a death by
    signal is transient (the group is killed; the client asks again), and so is an empty stdout; a non-zero exit
    is final (an LLMError with the end of stderr). A program that cannot be found is a ConfigError at once.
    Usage is not reported: the client counts the tokens of the text (`ksearch.llm.tokens`: KSEARCH_TOKENIZER,
    else tiktoken or an estimate; --max-tokens binds; --max-cost only with a priced --model)."""

    name = "command"
    #: its ``timeout_s`` covers the whole call (the program is killed at it): `ksearch.llm.client.bounded`
    bounds_total_time = True

    def __init__(self, command: str):
        try:
            self.argv = shlex.split(command)
        except ValueError as e:
            raise ConfigError(f"command backend: cannot split {command!r}: {e}") from None
        if not self.argv:
            raise ConfigError("command backend: the command is empty")
        if "{model}" not in self.argv[0] and shutil.which(self.argv[0]) is None:  # refused before a run exists
            raise ConfigError(f"command backend: {self.argv[0]!r} is not a program that can be run (not found, "
                              "or not executable)")
        self.command = command

    def __repr__(self) -> str:
        return f"CommandBackend({self.command!r})"

    def complete(self, messages: list[Message], *, model: str, max_tokens: int, temperature: float,
                 timeout_s: float) -> LLMReply:
        argv = [a.replace("{model}", model) for a in self.argv]
        env = dict(os.environ, KSEARCH_LLM_MODEL=model, KSEARCH_LLM_MAX_TOKENS=str(max_tokens),
                   KSEARCH_LLM_PURPOSE=call_purpose.get() or "")
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env=env, start_new_session=True)
        except OSError as e:
            raise LLMError(f"command backend: cannot start {argv[0]!r}: {e.strerror or e}") from None
        try:
            out, err = _communicate(proc, render_plain(messages).encode(), t0 + timeout_s)
        except subprocess.TimeoutExpired:
            self._kill(proc)
            raise TransientLLMError(f"command: {argv[0]} gave no reply within {timeout_s:g} s (killed)") from None
        except _TooLong:
            self._kill(proc)
            raise LLMError(f"command: {argv[0]} printed more than {_STDOUT_BYTES >> 20} MB on stdout (killed): "
                           "not a reply") from None
        except BaseException:
            self._kill(proc)
            raise
        latency = time.monotonic() - t0
        if proc.returncode < 0:
            try:
                sig = signal.Signals(-proc.returncode).name
            except ValueError:
                sig = f"signal {-proc.returncode}"
            raise TransientLLMError(f"command: {argv[0]} was killed by {sig}")
        if proc.returncode != 0:
            tail = err.decode("utf-8", "replace").strip()[-_STDERR_CHARS:]
            raise LLMError(f"command: {argv[0]} exited with status {proc.returncode}"
                           + (f"; stderr ends: {tail}" if tail else " (no stderr)"))
        text = out.decode("utf-8", "replace")
        if not text.strip():  # a program that answers nothing is not a model that said nothing: ask again
            tail = err.decode("utf-8", "replace").strip()[-_STDERR_CHARS:]
            raise TransientLLMError(f"command: {argv[0]} exited 0 but printed nothing on stdout"
                                    + (f"; stderr ends: {tail}" if tail else ""))
        return LLMReply(text=text, usage=Usage(), model=model, finish_reason=None, latency_s=latency)

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


#: bytes of a command's stdout read at most: past them the program is killed (``yes`` as the command filled
#: 2.5 GB of memory in 2 s and held the call far past --llm-timeout)
_STDOUT_BYTES = 64 << 20


class _TooLong(Exception):
    """The command printed more than `_STDOUT_BYTES` on stdout."""


def _communicate(proc: subprocess.Popen, data: bytes, deadline: float) -> tuple[bytes, bytes]:
    """``proc.communicate(data)`` until the monotonic ``deadline`` (then TimeoutExpired), reading at most
    `_STDOUT_BYTES` of stdout (then `_TooLong`) and keeping the last `_STDERR_CHARS` * 4 bytes of stderr."""
    out: list[bytes] = []
    err = bytearray()
    over = threading.Event()

    def feed() -> None:
        try:
            with proc.stdin:  # type: ignore[union-attr]
                proc.stdin.write(data)  # type: ignore[union-attr]
        except (BrokenPipeError, OSError, ValueError):  # a program that does not read its stdin
            pass

    def drain_out() -> None:
        size = 0
        with proc.stdout:  # type: ignore[union-attr]
            while block := proc.stdout.read1(1 << 16):  # type: ignore[union-attr]
                size += len(block)
                if size > _STDOUT_BYTES:
                    over.set()
                    return
                out.append(block)

    def drain_err() -> None:
        with proc.stderr:  # type: ignore[union-attr]
            while block := proc.stderr.read1(1 << 16):  # type: ignore[union-attr]
                err.extend(block)
                del err[:-_STDERR_CHARS * 4]

    threads = [threading.Thread(target=f, daemon=True) for f in (feed, drain_out, drain_err)]
    for t in threads:
        t.start()
    while True:
        if over.is_set():
            raise _TooLong
        left = deadline - time.monotonic()
        if left <= 0:
            raise subprocess.TimeoutExpired(proc.args, 0)
        try:
            proc.wait(timeout=min(left, 0.05))
            break
        except subprocess.TimeoutExpired:
            continue
    for t in threads[1:]:  # the pipes' ends: a child the program left behind may still hold them
        t.join(max(deadline - time.monotonic(), 0.0))
        if t.is_alive():
            raise subprocess.TimeoutExpired(proc.args, 0)
    if over.is_set():
        raise _TooLong
    return b"".join(out), bytes(err)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


_PROMPT_FILE = re.compile(r"^(\d{4,})-(.+)\.prompt\.md$")


class QueueBackend:
    """Write each prompt to ``directory`` and wait for the reply file (the protocol is in the module docstring).

    ``poll_s``: how often the reply file is looked for; ``wait_s``: how long one attempt waits, when it should
    differ from the client's per-call timeout (None: the client's). Usage is not reported (0 tokens: the client
    counts the text, `ksearch.llm.tokens`).
    """

    name = "queue"
    #: its wait covers the whole call: `ksearch.llm.client.bounded`
    bounds_total_time = True

    def __init__(self, directory: str | os.PathLike, *, poll_s: float = 0.5, wait_s: float | None = None,
                 sleep=time.sleep, clock=time.monotonic):
        self.directory = Path(directory).expanduser()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"queue backend: {self.directory} cannot be created: {e.strerror}") from None
        probe = self.directory / f".ksearch-probe.{os.getpid()}"
        try:  # refused now, before a run exists, not at the run's first prompt
            _atomic_write(probe, "")
            probe.unlink()
        except OSError as e:
            raise ConfigError(f"queue backend: {self.directory} is not writable: {e.strerror or e}") from None
        self.poll_s = poll_s
        self.wait_s = wait_s
        self._sleep = sleep
        self._clock = clock

    def __repr__(self) -> str:
        return f"QueueBackend({str(self.directory)!r})"

    def complete(self, messages: list[Message], *, model: str, max_tokens: int, temperature: float,
                 timeout_s: float) -> LLMReply:
        h = prompt_hash(messages, model)
        try:
            stem = self._pending(h) or self._post(messages, model, max_tokens, temperature, h)
        except OSError as e:  # the directory went away or became read-only during the run
            raise LLMError(f"queue: cannot write the prompt in {self.directory}: {e.strerror or e}") from None
        reply = self.directory / f"{stem}.reply.md"
        wait = self.wait_s if self.wait_s is not None else timeout_s
        t0 = self._clock()
        deadline = t0 + wait
        seen = None
        while True:
            try:
                st = reply.stat()
                sig = (st.st_size, st.st_mtime_ns) if st.st_size > 0 else None
            except FileNotFoundError:
                sig = None
            now = self._clock()
            if sig is not None and (sig == seen or now >= deadline):
                try:
                    text = reply.read_text(encoding="utf-8", errors="replace")
                except OSError as e:
                    raise LLMError(f"queue: cannot read {reply}: {e.strerror or e}") from None
                if text.strip():
                    self._consume(stem)
                    return LLMReply(text=text, usage=Usage(), model=model, finish_reason=None,
                                    latency_s=now - t0)
            seen = sig
            if now >= deadline:
                raise TransientLLMError(f"queue: no reply in {reply} within {wait:g} s")
            self._sleep(max(0.0, min(self.poll_s, deadline - now)))

    # -- files ------------------------------------------------------------------------------------------

    def _pending(self, h: str) -> str | None:
        """The stem of an unconsumed prompt with this hash (a retry, or a resumed run asking again)."""
        for js in sorted(self.directory.glob("*.json")):
            try:
                doc = json.loads(js.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(doc, dict) and doc.get("prompt_hash") == h and not doc.get("consumed") and \
                    (self.directory / f"{js.name[:-5]}.prompt.md").exists():
                return js.name[:-5]
        return None

    def _post(self, messages: list[Message], model: str, max_tokens: int, temperature: float, h: str) -> str:
        numbers = [int(m.group(1)) for p in self.directory.iterdir() if (m := _PROMPT_FILE.match(p.name))]
        seq = max(numbers, default=0) + 1
        purpose = call_purpose.get() or "call"
        slug = re.sub(r"[^A-Za-z0-9]+", "-", purpose).strip("-")[:60] or "call"
        stem = f"{seq:04d}-{slug}"
        reply_file = f"{stem}.reply.md"
        doc = {"seq": seq, "purpose": purpose, "model": model, "max_tokens": max_tokens,
               "temperature": temperature, "prompt_hash": h,
               "messages": [{"role": m.role, "content": m.content} for m in messages], "reply_file": reply_file,
               "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "consumed": False}
        header = (f"<!-- ksearch llm queue: prompt {seq:04d} ({purpose}; model {model}; at most {max_tokens} "
                  f"tokens).\n     Answer by writing the reply to {reply_file} in this directory. -->\n\n")
        _atomic_write(self.directory / f"{stem}.json", json.dumps(doc, indent=1))
        _atomic_write(self.directory / f"{stem}.prompt.md", header + render_plain(messages))
        return stem

    def _consume(self, stem: str) -> None:
        path = self.directory / f"{stem}.json"
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return
        doc["consumed"] = True
        try:
            _atomic_write(path, json.dumps(doc, indent=1))
        except OSError:  # the reply is read; an unmarked prompt is only reused for the same question
            pass


BACKENDS = ("openai", "anthropic", "command", "queue")


def make_backend(kind: str, *, base_url: str | None = None, api_key: str | None = None,
                 command: str | None = None, queue_dir: str | os.PathLike | None = None,
                 api_key_env: str | None = None) -> Backend:
    """The backend ``kind`` (openai | anthropic | command | queue). For openai and anthropic without
    ``api_key``, the key is looked up (`ksearch.llm.keys.resolve_api_key`, with ``api_key_env``).

    Raises:
        ConfigError: an unknown kind, or a setting the kind needs is missing (the message says which).
    """
    if kind in ("openai", "anthropic"):
        if api_key is None:
            from ksearch.llm.keys import resolve_api_key

            api_key = resolve_api_key(kind, base_url, api_key_env)
        return (OpenAIBackend if kind == "openai" else AnthropicBackend)(base_url=base_url, api_key=api_key)
    if kind == "command":
        if not command or not command.strip():
            raise ConfigError("the command backend needs a command (--command): the program that reads a prompt "
                              "on stdin and writes the reply on stdout")
        return CommandBackend(command)
    if kind == "queue":
        if not queue_dir:
            raise ConfigError("the queue backend needs a directory (--queue-dir) where prompts are written and "
                              "reply files read")
        return QueueBackend(queue_dir)
    raise ConfigError(f"unknown llm backend {kind!r}: use one of {', '.join(BACKENDS)}")
