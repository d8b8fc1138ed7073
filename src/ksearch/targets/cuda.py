"""The cuda target: CUDA C++ compiled at run time with NVRTC (through CuPy), launched as its plan declares.

The controller's side (`CudaTarget.compile`) checks the launch plan and the NVRTC options and writes the
candidate (sources, options, plan) to ``$KSEARCH_HOME/cache/cuda/<candidate id>.json``, the artifact the
worker loads; it needs neither CuPy nor a GPU. The worker (`CudaTarget.load`, inside the sandbox) compiles
with NVRTC for its device's architecture and returns a `ksearch.targets.cuda_runtime.CudaRunner` (a
`ksearch.targets.cuda_checks.CheckedRunner`): the worker owns the CUDA context, so compiling there needs no
second context. An NVRTC failure raises KernelCompileError, which the judge reports as COMPILE_ERROR with the
NVRTC log; a module that keeps state between calls, or a kernel that writes its device inputs, raises
KernelRejected (REJECTED; see `cuda_checks`).

A candidate's modules are compiled once per worker and not cached on disk (a cache shared between workers
would let a hostile candidate plant a binary under another candidate's key); `cuda_runtime.compile_module`
has what that costs.

ABI and plan format: docs/cuda-target.md.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ksearch import config
from ksearch.errors import PlanError
from ksearch.jail.sandbox import CUDA_ENV, NVIDIA_DEVICES
from ksearch.records import Candidate
from ksearch.targets.abi_types import CUDA_TYPES, c_params
from ksearch.targets.base import PROMPTS_DIR, CompileResult, DeviceTargetDefaults
from ksearch.targets.cuda_launch import parse_plan, refused_flag
from ksearch.tasks.definition import Definition

if TYPE_CHECKING:
    from ksearch.hardware.spec import HardwareSpec

SOURCE_EXT = (".cu", ".cuh")
BASE_OPTIONS = ("-std=c++17",)


def cupy_status() -> str | None:
    """None when CuPy imports and sees a CUDA device, else why not ("cupy not installed", "no CUDA device")."""
    try:
        import cupy  # noqa: F401
    except ImportError:
        return "cupy not installed (pip install cupy-cuda12x or cupy-cuda13x)"
    except Exception as e:  # a broken CUDA installation
        return f"cupy does not import: {type(e).__name__}: {e}"
    try:
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        return f"no CUDA device ({type(e).__name__}: {e})"
    return None if count > 0 else "no CUDA device"


def combined_source(candidate: Candidate) -> str:
    """The candidate's .cu files in name order as one translation unit (.cuh files are only for #include
    by name, which NVRTC cannot resolve from memory: they are prepended too)."""
    names = sorted(n for n in candidate.sources if n.endswith(".cuh")) + \
        sorted(n for n in candidate.sources if n.endswith(".cu"))
    return "\n".join(f'#line 1 "{n}"\n{candidate.sources[n]}' for n in names)


class CudaTarget(DeviceTargetDefaults):
    name = "cuda"
    summary = "CUDA C++ on an NVIDIA GPU through CuPy's NVRTC, launched as its plan declares"
    source_suffixes = SOURCE_EXT
    fence_langs = {".cu": "cuda", ".cuh": "cuda"}
    fence_files = {"cuda": "kernel.cu", "cu": "kernel.cu", "cpp": "kernel.cu", "c++": "kernel.cu"}
    fence_lang = "cuda"
    naive_file = "kernel.cu"
    takes_launch = True
    launch_keys = "launches, temporaries"
    ctypes = CUDA_TYPES
    hardware_kind = "gpu"
    needs_gpu = True
    gpu_devices = NVIDIA_DEVICES
    gpu_env = CUDA_ENV
    spare_workers = False
    rule_family = "cuda"
    limit_family = "cuda"
    translation_map = None
    torch_device = "cuda"
    runs_mlx = False
    checks_without_device = None
    prompt_template = PROMPTS_DIR / "cuda.j2"
    reply_format = "one ```cuda block (kernel.cu) and one ```yaml block with the launch plan"

    def abi(self, definition: Definition) -> str:
        """The kernels' parameters in the cuda dialect (docs/cuda-target.md); the plan orders the arguments."""
        params = ", ".join(c_params(definition, self.ctypes, "long long"))
        return f'extern "C" __global__ void your_kernel({params});  // args and their order: the launch plan'

    def hardware_spec(self) -> HardwareSpec:
        """The local GPU's spec, measured with CuPy probes (`ksearch.hardware.gpu.load_or_measure_gpu`)."""
        from ksearch.hardware.gpu import load_or_measure_gpu

        return load_or_measure_gpu()

    def available(self) -> str | None:
        return cupy_status()

    def profiler(self):
        """Nsight Compute (`ksearch.targets.cuda_profile.NcuProfiler`), found on PATH or in CUDA's bin directory
        (unavailable, saying so, where it is not installed)."""
        from ksearch.targets.cuda_profile import NcuProfiler, find_ncu

        return NcuProfiler(find_ncu())

    def compile(self, candidate: Candidate, definition: Definition, timeout_s: float = 120.0) -> CompileResult:
        """Check the plan and options and write the artifact the worker compiles (see the module docstring).
        A bad plan or option is ok=False with the field named."""
        t0 = time.perf_counter()
        if not any(n.endswith(".cu") for n in candidate.sources):
            return CompileResult(False, None, f"no CUDA source among {sorted(candidate.sources)} (expected a .cu file)",
                                 0.0)
        for name in candidate.sources:
            if "/" in name or name.startswith(".") or not name.endswith(SOURCE_EXT):
                return CompileResult(False, None, f"source name {name!r} must be a plain *.cu or *.cuh file name", 0.0)
        refused = refused_flag(candidate.compile_flags)
        if refused:
            return CompileResult(False, None, refused, 0.0)
        try:
            parse_plan(candidate.launch, definition)
        except PlanError as e:
            return CompileResult(False, None, str(e), 0.0)
        cache = config.home_dir() / "cache" / "cuda"
        cache.mkdir(parents=True, exist_ok=True)
        artifact = cache / f"{candidate.id}.json"
        if artifact.is_file():
            return CompileResult(True, artifact, "(cached; NVRTC compiles in the worker)", time.perf_counter() - t0,
                                 cached=True)
        options = list(BASE_OPTIONS if not any(f.lstrip("-").startswith("std=") for f in candidate.compile_flags)
                       else ()) + list(candidate.compile_flags)
        payload = {"source": combined_source(candidate), "options": options, "launch": candidate.launch}
        partial = artifact.with_suffix(f".{time.monotonic_ns()}.tmp")
        partial.write_text(json.dumps(payload))
        partial.replace(artifact)
        return CompileResult(True, artifact, "(NVRTC compiles in the worker)", time.perf_counter() - t0)

    def load(self, artifact: Path, candidate: Candidate, definition: Definition):
        """Inside the worker: compile with NVRTC, check the module for state (`cuda_checks`) and return a
        runner that also checks, after every call, that the kernel left its device inputs alone.

        Raises:
            KernelCompileError: NVRTC refused the source, or a kernel of the plan is not in it.
            KernelRejected: the compiled module keeps state between calls (global variables, device heap).
            TargetError: CuPy or the device is missing.
        """
        from ksearch.targets.cuda_checks import CheckedRunner, check_module

        payload = json.loads(Path(artifact).read_text())
        plan = parse_plan(payload["launch"], definition)
        runner = CheckedRunner(payload["source"], payload["options"], plan, definition)
        check_module(runner.images)
        return runner


#: the targets this module provides (`ksearch.targets.base.get_target`) and where they are listed
TARGETS = {"cuda": CudaTarget}
ORDER = 10
