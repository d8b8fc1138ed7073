"""The null target: kernels are Python on NumPy arrays, with no compiler and no device (as tinygrad's NULL device).

It runs the whole stack (static pass, judge, worker, timing, search) where no compiler is, and in tests. A
candidate is one Python file (``kernel.py``) defining ``run(inputs..., outputs..., axes...)``: the ABI of the cpu
target's C kernels with NumPy arrays for pointers. Inputs are read-only row-major arrays (bfloat16 as its uint16
bits), outputs writable arrays the kernel fills in place (their old contents are NaN poison), then Python-scalar
inputs as numbers and every axis as an int, in definition order. What ``run`` returns is ignored.

"Compiling" (`NullTarget.compile`) refuses anything but one ``.py`` file, any compile flag and any launch plan,
compiles the module with Python's ``compile()`` (a syntax error is a COMPILE_ERROR naming the file, line and
column), checks that ``run`` is defined at module level with one positional parameter per argument, and writes
the source to ``$KSEARCH_HOME/cache/null/<candidate id>.py``, the artifact the worker imports
(`ksearch.targets.null_runtime.NullRunner`, timed by the controller's clock as the cpu target is: prepare, go).

The naive kernel is the task's ``naive.null.py`` where it ships one, else derived from the task's definition:
a module that runs the definition's reference (`ksearch.tasks.reference.run_reference`) on the arguments and
writes its float64 outputs, cast to their dtypes, into the output arrays, so every task runs with no data
added. The hardware spec is the local CPU's. No static rules: the sandbox alone contains a kernel,
and its times are worth only an honest kernel's (a Python kernel can rebind the runner it runs in and do its work
outside the timed call: docs/evaluation.md, "What the judge does not guarantee").
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from ksearch import config
from ksearch.errors import HardwareError
from ksearch.records import Candidate
from ksearch.targets.base import PROMPTS_DIR, CompileResult, naive_from_task
from ksearch.targets.py_source import check_module
from ksearch.tasks.definition import Definition

if TYPE_CHECKING:
    from ksearch.hardware.spec import HardwareSpec
    from ksearch.targets.null_runtime import NullRunner
    from ksearch.tasks.loader import Task

#: the naive kernel derived from a task's definition (`naive_source`)
NAIVE_TEMPLATE = '''"""The naive null kernel of {task}: the task's reference run on the arguments (derived from its definition
by the null target, ksearch/targets/null.py: the task ships no naive.null.py)."""

import numpy as np

from ksearch.tasks.definition import Definition
from ksearch.tasks.inputs import bf16_from_f32
from ksearch.tasks.reference import run_reference

DEFINITION = Definition.model_validate_json({definition!r})
INPUTS, OUTPUTS = list(DEFINITION.inputs), list(DEFINITION.outputs)


def run(*args):
    inputs = dict(zip(INPUTS, args))
    outputs = dict(zip(OUTPUTS, args[len(INPUTS):len(INPUTS) + len(OUTPUTS)]))
    for name, want in run_reference(DEFINITION, inputs).items():
        out = outputs[name]
        if DEFINITION.outputs[name].dtype == "bfloat16":  # NumPy holds bfloat16 as its uint16 bits
            out[...] = bf16_from_f32(want.astype(np.float32)).reshape(out.shape)
        else:
            out[...] = want.reshape(out.shape)
'''


def naive_source(definition: Definition) -> str:
    """The derived naive kernel of ``definition`` (see the module docstring): deterministic, so its candidate id
    is the same in every process."""
    return NAIVE_TEMPLATE.format(task=definition.name, definition=definition.model_dump_json())


class NullTarget:
    """The null target (see the module docstring)."""

    name = "null"
    summary = "Python kernels on NumPy arrays, no compiler and no device: for tests and machines without a compiler"
    source_suffixes = (".py",)
    fence_langs = {".py": "python"}
    fence_files = {"python": "kernel.py", "py": "kernel.py"}
    fence_lang = "python"
    naive_file = "kernel.py"
    takes_launch = False
    launch_keys = ""
    ctypes = None
    hardware_kind = "cpu"
    needs_gpu = False
    gpu_devices: tuple[str, ...] = ()
    gpu_env: tuple[str, ...] = ()
    spare_workers = True
    rule_family = None
    limit_family = None
    translation_map = None
    torch_device = "cpu"
    runs_mlx = False
    checks_without_device = None
    prompt_template = PROMPTS_DIR / "null.j2"
    reply_format = "one ```python block (kernel.py)"
    flags_help = None  # nothing is compiled

    expand = None  # no static rules read it

    def evict_library(self) -> Path | None:
        """The cpu target's eviction library (its arguments are host memory too), None where no C compiler
        builds it: the runner then writes a buffer."""
        from ksearch.targets.cpu import CpuTarget

        return CpuTarget().evict_library()

    def compile_report(self, candidate: Candidate, definition: Definition, timeout_s: float = 120.0) -> None:
        return None  # nothing is compiled

    def profiler(self) -> None:
        return None  # no profiler reads a Python kernel

    def available(self) -> str | None:
        return None  # NumPy is a dependency of ksearch

    def abi(self, definition: Definition) -> str:
        """``def run(inputs..., outputs..., axes...)``: NumPy arrays, then ints (see the module docstring)."""
        params = [*definition.inputs, *definition.outputs, *definition.axes]
        return f"def run({', '.join(params)}) -> None"

    def naive_candidate(self, task: Task) -> Candidate | None:
        """The task's ``naive.null.py``, else the kernel derived from its definition (`naive_source`)."""
        shipped = naive_from_task(self, task)
        if shipped is not None:
            return shipped
        return Candidate(target=self.name, sources={self.naive_file: naive_source(task.definition)},
                         meta={"role": "naive"})

    def hardware_spec(self) -> HardwareSpec:
        """The local CPU's spec: measured by the C probes once, then cached (`ksearch.hardware.cache.load_or_measure`);
        where no C compiler is, its ceilings measured with NumPy (`ksearch.hardware.local.numpy_spec`, provisional).
        Raises HardwareError when a probe fails."""
        from ksearch.hardware.cache import load_or_measure
        from ksearch.hardware.local import numpy_spec
        from ksearch.hardware.probes import find_compiler

        try:
            find_compiler()
        except HardwareError:  # no compiler: the whole stack still runs, on NumPy's own ceilings
            return numpy_spec()
        return load_or_measure()

    def launch_problem(self, candidate: Candidate, definition: Definition, axes: dict[str, int]) -> str | None:
        return None

    def compile(self, candidate: Candidate, definition: Definition, timeout_s: float = 120.0) -> CompileResult:
        """Check the module (one .py file, no flags, no launch plan, valid Python, ``run`` with the ABI's arity) and
        write the artifact the worker imports. A bad candidate is ok=False with the reason; nothing of it runs."""
        t0 = time.perf_counter()
        names = sorted(candidate.sources)
        if len(names) != 1 or not names[0].endswith(".py"):
            return CompileResult(False, None, f"a null candidate is one Python file (e.g. kernel.py); got {names}", 0.0)
        name = names[0]
        if "/" in name or "\\" in name or name.startswith("."):
            return CompileResult(False, None, f"source name {name!r} must be a plain *.py file name", 0.0)
        if candidate.compile_flags:
            return CompileResult(False, None, f"the null target takes no compile flags; got {candidate.compile_flags}",
                                 0.0)
        if candidate.launch:
            return CompileResult(False, None, "the null target takes no launch plan: run() is called once", 0.0)
        source = candidate.sources[name]
        abi = [*definition.inputs, *definition.outputs, *definition.axes]
        problem = check_module(source, name, candidate.entry_point, abi)
        if problem:
            return CompileResult(False, None, problem, time.perf_counter() - t0)
        cache = config.home_dir() / "cache" / self.name
        cache.mkdir(parents=True, exist_ok=True)
        artifact = cache / f"{candidate.id}.py"
        if artifact.is_file() and artifact.read_text() == source:
            return CompileResult(True, artifact, "(cached; syntax checked)", time.perf_counter() - t0, cached=True)
        partial = artifact.with_suffix(f".{time.monotonic_ns()}.tmp")
        partial.write_text(source)
        partial.replace(artifact)
        return CompileResult(True, artifact, "(syntax checked)", time.perf_counter() - t0)

    def load(self, artifact: Path, candidate: Candidate, definition: Definition) -> NullRunner:
        """Inside the worker: import the module and return its `ksearch.targets.null_runtime.NullRunner`.

        Raises:
            KernelCompileError: the module does not import, or defines no callable entry point.
        """
        from ksearch.targets.null_runtime import NullRunner

        return NullRunner(Path(artifact), candidate.entry_point, source_name=next(iter(candidate.sources), "kernel.py"))


#: the targets this module provides (`ksearch.targets.base.get_target`) and where they are listed (last: a
#: target for tests, never the default)
TARGETS = {"null": NullTarget}
ORDER = 90
