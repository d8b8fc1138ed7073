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

import time
from pathlib import Path
from typing import TYPE_CHECKING

from ksearch import config
from ksearch.jail.sandbox import CUDA_ENV, NVIDIA_DEVICES
from ksearch.records import Candidate
from ksearch.targets.base import PROMPTS_DIR, CompileResult, DeviceTargetDefaults
from ksearch.targets.py_source import check_module, entry_arity_problem  # noqa: F401 - entry_arity_problem: re-exported
from ksearch.tasks.definition import Definition

if TYPE_CHECKING:
    from ksearch.hardware.spec import HardwareSpec

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


class TritonTarget(DeviceTargetDefaults):
    name = "triton"
    summary = "Triton kernels in a Python module on an NVIDIA GPU, through torch"
    source_suffixes = (SOURCE_EXT,)
    fence_langs = {".py": "python"}
    fence_files = {"python": "kernel.py", "py": "kernel.py"}
    fence_lang = "python"
    naive_file = "kernel.py"
    takes_launch = False
    launch_keys = ""
    ctypes = None
    hardware_kind = "gpu"
    needs_gpu = True
    gpu_devices = NVIDIA_DEVICES
    gpu_env = CUDA_ENV
    spare_workers = False
    rule_family = "triton"
    #: Triton kernels hit the NVIDIA GPU's per-block limits (as "out of resource" when Triton compiles)
    limit_family = "cuda"
    translation_map = "triton"
    torch_device = "cuda"
    runs_mlx = False
    checks_without_device = None
    prompt_template = PROMPTS_DIR / "triton.j2"
    reply_format = "one ```python block (kernel.py)"

    def abi(self, definition: Definition) -> str:
        """``run(inputs..., outputs...)``: torch CUDA tensors; the axes are their shapes."""
        return f"run({', '.join([*definition.inputs, *definition.outputs])})"

    def hardware_spec(self) -> HardwareSpec:
        """The local GPU's spec, measured with CuPy probes (`ksearch.hardware.gpu.load_or_measure_gpu`)."""
        from ksearch.hardware.gpu import load_or_measure_gpu

        return load_or_measure_gpu()

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
        problem = check_module(source, name, candidate.entry_point, list(definition.inputs) + list(definition.outputs))
        if problem:
            return CompileResult(False, None, problem, time.perf_counter() - t0)
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


#: the targets this module provides (`ksearch.targets.base.get_target`) and where they are listed
TARGETS = {"triton": TritonTarget}
ORDER = 20
