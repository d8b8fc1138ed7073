"""A Triton-interpreter worker process for pack tests: TRITON_INTERPRET must be set before triton is first
imported (triton.language's own @triton.jit helpers are built at import), so kernels run in a subprocess that
reads one JSON request a line and answers one JSON object a line (a test module's WORKER script defines both)."""

import json
import os
import subprocess
import sys

import pytest

#: The worker's request loop, for a module's WORKER script to start with and end by calling ``serve(answer)``:
#: each request line ({"source", ...}) is written to a file and imported as a module, then answered with
#: ``answer(module, request)`` (a JSON object), or {"error": traceback} when anything raises.
SERVE = r"""
import importlib.util, json, sys, tempfile, traceback


def serve(answer):
    tmp = tempfile.mkdtemp()
    for n, line in enumerate(sys.stdin):
        req = json.loads(line)
        try:
            path = f"{tmp}/kernel_{n}.py"
            with open(path, "w") as f:
                f.write(req["source"])
            spec = importlib.util.spec_from_file_location(f"kernel_{n}", path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            out = answer(mod, req)
        except Exception:
            out = {"error": traceback.format_exc()[-3000:]}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()
"""


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
