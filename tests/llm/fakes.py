"""Fakes of every way ksearch reaches a model, for anyone's tests. Nothing here touches the network beyond
127.0.0.1.

Script steps (the servers take all of them; `scripted_command` and `ScriptedBackend` say which they take):

- ``"text"`` or ``Reply(text, input_tokens=11, output_tokens=7, finish_reason=None, usage=None)``: an answer
  (the provider's normal stop reason unless given; ``usage``: the body's ``usage`` object exactly as given, in
  place of the one built from the two counts: cache fields, nulls, odd shapes);
- ``Truncated(text)``: an answer cut off at the token limit (finish_reason ``length`` / ``max_tokens``);
- ``Status(429, retry_after=0)``, ``Status(500)``, ``Status(401, message=...)``: an HTTP error with the
  provider's error body (and a Retry-After header when ``retry_after`` is given);
- ``Hang(seconds)``: answer nothing for that long (past the client's timeout), then a 500;
- ``Garbage()``: HTTP 200 whose body is not JSON.
- ``Trickle(interval=1.0, headers=False)``: a good answer sent one byte every ``interval`` seconds (its headers at
  once, or trickled too with ``headers=True``): each read gets a byte in time, the whole takes minutes.

When a server's script runs out it answers ``default`` when one was given (repeated forever), else HTTP 500
with the message "script exhausted" (so a test that asks once too often sees a failure, not a hang).

Example::

    from ksearch.llm.backends import OpenAIBackend
    from ksearch.llm.client import LLMClient
    from tests.llm.fakes import ScriptedOpenAIServer, Status

    with ScriptedOpenAIServer([Status(429, retry_after=0), "hello"]) as srv:
        client = LLMClient(OpenAIBackend(srv.base_url, "sk-test"), sleep=lambda s: None)
        assert client.ask("planner", "plan:initial", msgs, model="gpt-4o").text == "hello"
        assert len(srv.requests) == 2 and srv.requests[-1]["model"] == "gpt-4o"
"""

from __future__ import annotations

import json
import shlex
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from ksearch.llm.base import LLMReply, Message, Usage

# -- script steps ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    text: str
    input_tokens: int = 11
    output_tokens: int = 7
    finish_reason: str | None = None
    usage: object = None


@dataclass(frozen=True)
class Truncated:
    text: str
    input_tokens: int = 11
    output_tokens: int = 7


@dataclass(frozen=True)
class Status:
    code: int
    retry_after: float | None = None
    message: str | None = None


@dataclass(frozen=True)
class Hang:
    seconds: float


@dataclass(frozen=True)
class Garbage:
    body: str = "<html><body>upstream hiccup</body></html>"
    content_type: str = "application/json"


@dataclass(frozen=True)
class Trickle:
    text: str = "a reply that takes its time"
    interval: float = 1.0
    headers: bool = False


@dataclass(frozen=True)
class Fail:
    """`scripted_command`: exit with ``code`` after writing ``stderr``."""

    code: int = 1
    stderr: str = "something went wrong"


@dataclass(frozen=True)
class Killed:
    """`scripted_command`: die by SIGKILL."""


# -- HTTP servers ---------------------------------------------------------------------------------------


class _ScriptedServer:
    """An HTTP server on 127.0.0.1:0 in a thread, answering POSTs to ``path`` from a script."""

    path = ""
    stop_reason = ""
    length_reason = ""

    def __init__(self, script=(), *, default=None):
        self.script = deque(script)
        self.default = default
        self.requests: list = []  # JSON bodies received, in order (raw text when not JSON)
        self.headers: list[dict[str, str]] = []  # their headers (lower-case names)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._count = 0
        self.trickled = 0  # bytes a Trickle step has sent
        self.hung_up = 0  # Trickle steps whose client closed the connection

    # lifecycle
    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.close()

    def start(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                owner._handle(self)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        raise NotImplementedError

    @property
    def remaining(self) -> int:
        return len(self.script)

    # one request
    def _next(self):
        with self._lock:
            if self.script:
                return self.script.popleft()
            return self.default

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        raw = h.rfile.read(int(h.headers.get("content-length") or 0)).decode("utf-8", "replace")
        try:
            body = json.loads(raw)
        except ValueError:
            body = raw
        with self._lock:
            self.requests.append(body)
            self.headers.append({k.lower(): v for k, v in h.headers.items()})
            self._count += 1
            n = self._count
        if h.path.rstrip("/") != self.path:
            return self._send(h, 404, self._error_body(404, f"no route {h.path}"))
        step = self._next()
        model = body.get("model", "") if isinstance(body, dict) else ""
        if step is None:
            return self._send(h, 500, self._error_body(500, "scripted server: script exhausted"))
        if isinstance(step, str):
            step = Reply(step)
        if isinstance(step, Reply):
            reply = self._reply_body(n, model, step.text, step.input_tokens, step.output_tokens,
                                     step.finish_reason or self.stop_reason)
            if step.usage is not None:
                reply["usage"] = step.usage
            return self._send(h, 200, reply)
        if isinstance(step, Truncated):
            return self._send(h, 200, self._reply_body(n, model, step.text, step.input_tokens, step.output_tokens,
                                                       self.length_reason))
        if isinstance(step, Status):
            headers = {} if step.retry_after is None else {"retry-after": f"{step.retry_after:g}"}
            return self._send(h, step.code, self._error_body(step.code, step.message or f"scripted {step.code}"),
                              headers)
        if isinstance(step, Hang):
            self._stopping.wait(step.seconds)
            return self._send(h, 500, self._error_body(500, "scripted server: hung"))
        if isinstance(step, Garbage):
            return self._send_raw(h, 200, step.body.encode(), step.content_type)
        if isinstance(step, Trickle):
            return self._trickle(h, step, json.dumps(self._reply_body(n, model, step.text, 11, 7,
                                                                      self.stop_reason)).encode())
        raise TypeError(f"unknown script step {step!r}")

    def _send(self, h, code: int, body: dict, headers: dict | None = None) -> None:
        self._send_raw(h, code, json.dumps(body).encode(), "application/json", headers)

    @staticmethod
    def _send_raw(h, code: int, data: bytes, content_type: str, headers: dict | None = None) -> None:
        try:
            h.send_response(code)
            h.send_header("content-type", content_type)
            h.send_header("content-length", str(len(data)))
            for k, v in (headers or {}).items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(data)
            h.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a Hang past its timeout)

    def _trickle(self, h, step: Trickle, body: bytes) -> None:
        head = (f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
                ).encode()
        data = head + body if step.headers else body
        try:
            if not step.headers:
                h.wfile.write(head)
                h.wfile.flush()
            for i in range(len(data)):
                if self._stopping.wait(step.interval):
                    return
                h.wfile.write(data[i:i + 1])
                h.wfile.flush()
                with self._lock:
                    self.trickled += 1
        except (BrokenPipeError, ConnectionResetError):
            with self._lock:
                self.hung_up += 1  # the client closed the connection: what a cut call must do

    def _reply_body(self, n, model, text, inp, out, finish) -> dict:
        raise NotImplementedError

    def _error_body(self, code: int, message: str) -> dict:
        raise NotImplementedError


class ScriptedOpenAIServer(_ScriptedServer):
    """POST /v1/chat/completions, as OpenAI answers it. ``base_url`` ends in /v1 (give it to OpenAIBackend)."""

    path = "/v1/chat/completions"
    stop_reason = "stop"
    length_reason = "length"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _reply_body(self, n, model, text, inp, out, finish) -> dict:
        return {"id": f"chatcmpl-fake-{n}", "object": "chat.completion", "created": int(time.time()),
                "model": model, "system_fingerprint": None,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                             "finish_reason": finish, "logprobs": None}],
                "usage": {"prompt_tokens": inp, "completion_tokens": out, "total_tokens": inp + out}}

    def _error_body(self, code: int, message: str) -> dict:
        kind = {429: "rate_limit_exceeded", 401: "invalid_request_error"}.get(code, "server_error")
        return {"error": {"message": message, "type": kind, "param": None, "code": str(code)}}


class ScriptedAnthropicServer(_ScriptedServer):
    """POST /v1/messages, as Anthropic answers it. ``base_url`` is the bare origin (give it to
    AnthropicBackend; the SDK adds /v1/messages)."""

    path = "/v1/messages"
    stop_reason = "end_turn"
    length_reason = "max_tokens"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _reply_body(self, n, model, text, inp, out, finish) -> dict:
        return {"id": f"msg_fake_{n}", "type": "message", "role": "assistant", "model": model,
                "content": [{"type": "text", "text": text}], "stop_reason": finish, "stop_sequence": None,
                "usage": {"input_tokens": inp, "output_tokens": out}}

    def _error_body(self, code: int, message: str) -> dict:
        kind = {429: "rate_limit_error", 401: "authentication_error", 400: "invalid_request_error",
                404: "not_found_error", 529: "overloaded_error"}.get(code, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}


# -- in-process backend ---------------------------------------------------------------------------------


class ScriptedBackend:
    """A `Backend` in this process, for tests of the client or the proposer. Steps: a str or an `LLMReply`
    (returned), an exception instance (raised: `TransientLLMError`, `LLMError`...). ``calls``: what it was
    asked (messages, model, max_tokens, temperature, timeout_s). When the script runs out it returns
    ``default`` (a str or LLMReply) if given, else raises AssertionError (a test asking too often)."""

    def __init__(self, script=(), *, default=None, name: str = "scripted"):
        self.script = deque(script)
        self.default = default
        self.name = name
        self.calls: list[dict] = []

    def complete(self, messages: list[Message], *, model: str, max_tokens: int, temperature: float,
                 timeout_s: float) -> LLMReply:
        self.calls.append({"messages": list(messages), "model": model, "max_tokens": max_tokens,
                           "temperature": temperature, "timeout_s": timeout_s})
        if self.script:
            step = self.script.popleft()
        elif self.default is not None:
            step = self.default
        else:
            raise AssertionError(f"ScriptedBackend: script exhausted at call {len(self.calls)}")
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, str):
            return LLMReply(text=step, usage=Usage(input_tokens=11, output_tokens=7), model=model,
                            finish_reason="stop")
        return step


# -- command --------------------------------------------------------------------------------------------

_COMMAND_SCRIPT = r'''
import json, os, signal, sys, time
state, steps_path, log_path = sys.argv[1:4]
prompt = sys.stdin.read()
env = {k: v for k, v in os.environ.items() if k.startswith("KSEARCH_LLM_")}
with open(log_path, "a") as f:
    f.write(json.dumps({"prompt": prompt, "env": env, "argv": sys.argv[4:]}) + "\n")
i = int(open(state).read() or 0) if os.path.exists(state) else 0
with open(state, "w") as f:
    f.write(str(i + 1))
steps = json.load(open(steps_path))
if i >= len(steps):
    sys.stderr.write("scripted command: script exhausted\n")
    sys.exit(3)
step = steps[i]
if step["kind"] == "reply":
    sys.stdout.write(step["text"])
elif step["kind"] == "fail":
    sys.stderr.write(step["stderr"])
    sys.exit(step["code"])
elif step["kind"] == "hang":
    time.sleep(step["seconds"])
    sys.stdout.write("too late")
elif step["kind"] == "killed":
    os.kill(os.getpid(), signal.SIGKILL)
'''


@dataclass
class ScriptedCommand:
    """What `scripted_command` made: ``command`` for CommandBackend; ``received()``: each call's stdin, env
    (the KSEARCH_LLM_* variables) and extra argv, in order."""

    command: str
    log_path: Path

    def received(self) -> list[dict]:
        if not self.log_path.exists():
            return []
        return [json.loads(line) for line in self.log_path.read_text().splitlines() if line.strip()]

    def prompts(self) -> list[str]:
        return [r["prompt"] for r in self.received()]


def scripted_command(tmp_path, replies, *, extra_args: str = "") -> ScriptedCommand:
    """A program answering successive calls from ``replies``: a str (printed to stdout, exit 0), `Fail`
    (stderr, exit code), `Hang` (sleep, then print), `Killed` (SIGKILL). State lives in a file, so each call
    is a fresh process. Past the end it exits 3 with "script exhausted" on stderr. ``extra_args`` is appended
    to the command line (e.g. ``"--model {model}"`` to see the substitution in ``received()[i]["argv"]``)."""
    d = Path(tempfile.mkdtemp(prefix="scripted-command-", dir=tmp_path))
    steps = []
    for r in replies:
        if isinstance(r, str):
            steps.append({"kind": "reply", "text": r})
        elif isinstance(r, Fail):
            steps.append({"kind": "fail", "code": r.code, "stderr": r.stderr})
        elif isinstance(r, Hang):
            steps.append({"kind": "hang", "seconds": r.seconds})
        elif isinstance(r, Killed):
            steps.append({"kind": "killed"})
        else:
            raise TypeError(f"scripted_command: unknown step {r!r}")
    (d / "steps.json").write_text(json.dumps(steps))
    (d / "answer.py").write_text(_COMMAND_SCRIPT)
    args = [sys.executable, str(d / "answer.py"), str(d / "state"), str(d / "steps.json"), str(d / "log.jsonl")]
    command = " ".join(shlex.quote(a) for a in args) + (f" {extra_args}" if extra_args else "")
    return ScriptedCommand(command, d / "log.jsonl")


# -- queue ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Delayed:
    """`QueueResponder`: answer ``text`` only after ``seconds``."""

    text: str
    seconds: float


class QueueResponder:
    """A thread answering a queue directory's prompts in order from ``replies``: a str (answered at once), a
    `Delayed` (answered later), None (never answered). A prompt that already has a reply file is left alone.
    Replies are written atomically (a temporary name, then a rename). Past the end of ``replies`` prompts stay
    unanswered. ``prompts``: (file name, text) of each prompt seen, in order. A context manager; `stop()` ends
    the thread."""

    def __init__(self, directory, replies, *, poll_s: float = 0.01):
        self.directory = Path(directory)
        self.replies = deque(replies)
        self.poll_s = poll_s
        self.prompts: list[tuple[str, str]] = []
        self._seen: set[str] = set()
        self._due: list[tuple[float, Path, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _loop(self) -> None:
        while not self._stop.is_set():
            for p in sorted(self.directory.glob("*.prompt.md")):
                reply = p.with_name(p.name[: -len(".prompt.md")] + ".reply.md")
                if p.name in self._seen or reply.exists():
                    continue
                self._seen.add(p.name)
                self.prompts.append((p.name, p.read_text()))
                step = self.replies.popleft() if self.replies else None
                if isinstance(step, str):
                    self._due.append((0.0, reply, step))
                elif isinstance(step, Delayed):
                    self._due.append((time.monotonic() + step.seconds, reply, step.text))
            now = time.monotonic()
            for item in [d for d in self._due if d[0] <= now]:
                self._due.remove(item)
                _, path, text = item
                tmp = path.with_name("." + path.name + ".tmp")
                tmp.write_text(text)
                tmp.rename(path)
            self._stop.wait(self.poll_s)
