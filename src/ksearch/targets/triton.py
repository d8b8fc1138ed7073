"""The triton target: a Python module with @triton.jit kernels and a ``run`` entry point, on an NVIDIA GPU.

A candidate is one Python source file (``kernel.py``, as the triton knowledge pack renders it) defining
``run(inputs..., outputs...)``: the task's inputs then its outputs, in definition order, as contiguous torch
CUDA tensors (scalar inputs as Python numbers; axes are not passed, they are the tensors' shapes). ``run``
launches its kernels on the current stream and writes the outputs in place; what it returns is ignored.

The controller's side (`TritonTarget.compile`) needs neither torch nor Triton nor a GPU: it refuses anything
but one ``.py`` file and any compile flag, compiles the module with Python's ``compile()`` (a syntax error is
a COMPILE_ERROR naming the file, line and column), checks that ``run`` is defined at module level with one
positional parameter per input and output, and writes the source to
``$KSEARCH_HOME/cache/triton/<candidate id>.py``, the artifact the worker imports. The worker
(`TritonTarget.load`, `ksearch.targets.triton_runtime`) imports it, and Triton compiles each kernel at its
first call there (a check call, never a timed one). Errors while importing the module or while Triton
compiles are COMPILE_ERROR with the message; anything raised by ``run`` otherwise is RUNTIME_ERROR.

docs/triton-target.md says what a candidate may do and what the judge enforces.
"""

from __future__ import annotations

import ast
import time
from pathlib import Path

from ksearch import config
from ksearch.records import Candidate
from ksearch.targets.base import CompileResult
from ksearch.tasks.definition import Definition

SOURCE_EXT = ".py"


def triton_status() -> str | None:
    """None when torch and Triton import and torch sees a CUDA device, else why not (in that order: no torch,
    no triton, no GPU)."""
    try:
        import torch
    except ImportError:
        return "torch not installed (pip install torch: a CUDA build, e.g. from download.pytorch.org/whl/cu130)"
    except Exception as e:  # a broken installation (missing CUDA libraries, ...)
        return f"torch does not import: {type(e).__name__}: {e}"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton not installed (pip install triton; CUDA builds of torch usually bring it)"
    except Exception as e:
        return f"triton does not import: {type(e).__name__}: {e}"
    try:
        if not torch.cuda.is_available():
            return f"no CUDA device (torch {torch.__version__} sees none; CUDA build: {torch.version.cuda or 'no'})"
        count = torch.cuda.device_count()
    except Exception as e:
        return f"no CUDA device ({type(e).__name__}: {e})"
    return None if count > 0 else "no CUDA device"


def entry_arity_problem(tree: ast.Module, entry: str, n_args: int, names: list[str]) -> str | None:
    """Why the module's ``entry`` function cannot be called with ``n_args`` positional arguments, or None."""
    fn = next((node for node in reversed(tree.body) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
               and node.name == entry), None)
    if fn is None:
        bound = any(isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == entry for t in node.targets)
                    for node in tree.body)
        if bound:
            return None  # e.g. run = make_run(): checked when the worker imports it
        return (f"the module defines no function {entry!r} at module level (the entry point, called as "
                f"{entry}({', '.join(names)}))")
    if isinstance(fn, ast.AsyncFunctionDef):
        return f"{entry!r} is a coroutine (async def); it must be a plain function that launches the kernels"
    a = fn.args
    positional = len(a.posonlyargs) + len(a.args)
    required = positional - len(a.defaults)
    required_kw = [k.arg for k, d in zip(a.kwonlyargs, a.kw_defaults) if d is None]
    if required_kw:
        return f"{entry!r} has required keyword-only parameters {required_kw}; the judge passes positional ones only"
    if required > n_args or (positional < n_args and a.vararg is None):
        takes = f"{required}" if required == positional else f"{required} to {positional}"
        return (f"{entry!r} takes {takes} positional parameters; the judge calls it with {n_args}: "
                f"{entry}({', '.join(names)})")
    return None


class TritonTarget:
    name = "triton"

    def available(self) -> str | None:
        return triton_status()

    def compile(self, candidate: Candidate, definition: Definition, timeout_s: float = 120.0) -> CompileResult:
        """Check the module (one .py file, no flags, valid Python, ``run`` with the right arity) and write the
        artifact the worker imports. A bad candidate is ok=False with the reason; Triton compiles later, in
        the worker."""
        t0 = time.perf_counter()
        names = sorted(candidate.sources)
        if len(names) != 1 or not names[0].endswith(SOURCE_EXT):
            return CompileResult(False, None, f"a triton candidate is one Python file (e.g. kernel.py); got {names}",
                                 0.0)
        name = names[0]
        if "/" in name or "\\" in name or name.startswith("."):
            return CompileResult(False, None, f"source name {name!r} must be a plain *.py file name", 0.0)
        if candidate.compile_flags:
            return CompileResult(False, None, f"the triton target takes no compile flags (got "
                                 f"{candidate.compile_flags}); set num_warps, num_stages, ... at the kernel launch", 0.0)
        if candidate.launch:
            return CompileResult(False, None, "the triton target takes no launch plan: run() launches the kernels", 0.0)
        source = candidate.sources[name]
        try:
            compile(source, name, "exec", dont_inherit=True)
            tree = ast.parse(source, name)
        except SyntaxError as e:
            return CompileResult(False, None, _syntax_message(e, name), time.perf_counter() - t0)
        except (ValueError, RecursionError, MemoryError) as e:  # NUL bytes; expressions nested too deep
            return CompileResult(False, None, f"{name}: not compilable Python: {type(e).__name__}: {e}",
                                 time.perf_counter() - t0)
        abi = list(definition.inputs) + list(definition.outputs)
        problem = entry_arity_problem(tree, candidate.entry_point, len(abi), abi)
        if problem:
            return CompileResult(False, None, f"{name}: {problem}", time.perf_counter() - t0)
        cache = config.home_dir() / "cache" / "triton"
        cache.mkdir(parents=True, exist_ok=True)
        artifact = cache / f"{candidate.id}.py"
        if artifact.is_file() and artifact.read_text() == source:
            return CompileResult(True, artifact, "(cached; Triton compiles in the worker)", time.perf_counter() - t0,
                                 cached=True)
        partial = artifact.with_suffix(f".{time.monotonic_ns()}.tmp")
        partial.write_text(source)
        partial.replace(artifact)
        return CompileResult(True, artifact, "(syntax checked; Triton compiles in the worker)",
                             time.perf_counter() - t0)

    def load(self, artifact: Path, candidate: Candidate, definition: Definition):
        """Inside the worker: import the module and return a TritonRunner.

        Raises:
            KernelCompileError: the module does not import, or has no callable entry point.
            TargetError: torch, Triton or the device is missing.
        """
        from ksearch.targets.triton_runtime import TritonRunner

        return TritonRunner(Path(artifact), candidate.entry_point, definition,
                            source_name=next(iter(candidate.sources), "kernel.py"))


def _syntax_message(e: SyntaxError, name: str) -> str:
    where = name + (f":{e.lineno}" if e.lineno else "") + (f":{e.offset}" if e.lineno and e.offset else "")
    text = (e.text or "").rstrip("\n")
    caret = f"\n    {text}\n    {' ' * max(0, (e.offset or 1) - 1)}^" if text else ""
    return f"{where}: {type(e).__name__}: {e.msg}{caret}"
