"""A Triton-interpreter worker process for pack tests: TRITON_INTERPRET must be set before triton is first
imported (triton.language's own @triton.jit helpers are built at import), so kernels run in a subprocess that
reads one JSON request a line and answers one JSON object a line (a test module's WORKER script defines both)."""

import json
import os
import subprocess
import sys

import pytest


def interpreter_worker(script: str, probe: dict):
    """Start ``script`` under TRITON_INTERPRET=1 and yield send(request) -> reply; skips (with the reason) without
    torch or triton, or when the ``probe`` request (the task's own naive kernel) answers with an error: a failure
    there is the interpreter's, not the pack's. Use from a module-scoped fixture with ``yield from``."""
    pytest.importorskip("torch", reason="torch not installed")
    pytest.importorskip("triton", reason="triton not installed")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)

    def send(request: dict) -> dict:
        proc.stdin.write(json.dumps(request) + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        if not line:
            pytest.fail(f"the interpreter's worker died: {proc.stderr.read()[-3000:]}")
        return json.loads(line)

    answer = send(probe)
    if "error" in answer:
        proc.stdin.close()
        pytest.skip(f"Triton's interpreter does not run the naive kernel here: {answer['error'][-300:]}")
    try:
        yield send
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
