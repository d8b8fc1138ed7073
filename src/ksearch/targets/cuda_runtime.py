"""The cuda target inside the worker: NVRTC compile, device buffers, launches, and GPU timing (CuPy).

Imported only in the worker (it imports CuPy). The worker hands it the same argument references as for
the cpu target (input files mapped from the controller, output files the controller compares) and gets
back what the cpu path returns: nothing for a plain call, (times in ms, output summaries) for a timing
request. The controller never knows the outputs lived on a GPU.

Per call: inputs copied host -> device (once per input set), outputs and poison-initialized temporaries
NaN-poisoned (0xA5 bytes for integers) on the device, the plan's launches run on the current stream, the
whole device synchronized, outputs copied back to the output files.
Timing (the loop is `ksearch.targets.gpu_timing`, shared with the triton target): warm-up calls on the
warm-up inputs; then per repeat, outside the clock: outputs re-poisoned and a buffer of max(flush_bytes,
2 x L2) bytes written (evicts L2); inside: the launch sequence between two CUDA events; the device
synchronized before the elapsed time is read. The timed inputs rotate among up to ``gpu_timing.ROTATE``
device copies at distinct addresses (same data: the controller checks every timed call's output summary
against the verified last one, so the data cannot differ).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ksearch.errors import KernelCompileError, PlanError, TargetError
from ksearch.protocol import ArgRef
from ksearch.targets.base import DeviceClockRunner
from ksearch.targets.cuda_launch import LaunchPlan, ResolvedLaunch, resolve, temporary_shape
from ksearch.targets.cuda_judge_kernels import JudgeKernels
from ksearch.targets.gpu_timing import rotation_copies, timed_repeats, warm_up
from ksearch.tasks.definition import Definition
from ksearch.tasks.inputs import numpy_dtype

_STATIC_SHARED_LIMIT = 48 * 1024


def opt_in_dynamic_shared(fn, dynamic_bytes: int) -> None:
    """Let ``fn`` (a CuPy ``Function``) launch with ``dynamic_bytes`` (int, bytes) of dynamic shared memory: where
    its static shared memory (``fn.shared_size_bytes``) plus those bytes pass 48 KB, the default a block may use,
    its ``max_dynamic_shared_size_bytes`` is raised to ``dynamic_bytes`` (cudaFuncAttributeMaxDynamicSharedMemorySize;
    CUDA C++ Programming Guide, "Shared Memory": blocks above 48 KB must opt in, and the attribute plus the static
    size may not pass the device's opt-in maximum). Comparing the dynamic bytes alone with 48 KB left a kernel with
    34 KB static and 32 KB dynamic unable to launch (CUDA_ERROR_INVALID_VALUE: the selective-scan pack's
    chunk_scan=transpose path on an H100, 2026-12-08)."""
    static = int(getattr(fn, "shared_size_bytes", 0) or 0)
    if static + dynamic_bytes > _STATIC_SHARED_LIMIT and fn.max_dynamic_shared_size_bytes < dynamic_bytes:
        fn.max_dynamic_shared_size_bytes = dynamic_bytes


#: NVRTC programs compiled at once in a worker, at most (and at most the CPUs the worker may use). Our choice:
#: the decode pack's 13 template instances compiled in 2.0 s on the H200 host as 13 programs on 8 threads,
#: against 4.6 s as one program (bench/results/gpu-attention-h200-20261130-session6.md, section 2)
COMPILE_THREADS = 8


def _usable_cpus() -> int:
    import os

    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def compile_module(cp, source: str, options: list[str], names: list[str],
                   threads: int | None = None) -> tuple[list[bytes], dict]:
    """Compile ``source`` with NVRTC as CuPy's ``RawModule(code=...)`` does (CuPy's include paths and default
    C++ standard, ``-ftz=true`` appended, ``-arch=sm_XX`` for the device's architecture capped at NVRTC's
    newest, ``names`` as name expressions) and load it. The names are dealt round-robin into up to ``threads``
    NVRTC programs (default: min(COMPILE_THREADS, usable CPUs)), compiled at once (NVRTC releases the GIL);
    each program compiles the whole source and instantiates its names. On one CPU: one program, as CuPy does.

    Returns (the compiled images, one per program: cubins; the kernels, name expression ->
    ``cupy.RawKernel``). The images are what the worker's state check reads
    (`ksearch.targets.cuda_checks.check_module`): the bytes checked are the bytes loaded. Measured on the H200
    host (2026-11-30, the decode pack's 13 template instances, bench/results/logs-attention-20261130-s6/
    probe_load.py, one sample per call): 2.0 s as 13 programs on 8 threads, 4.6 s as one program, 9.6-12.5 s
    the way before (RawModule, then the check compiling the source again). On a 2-core VM without a GPU
    (`python bench/nvrtc_compile_split.py`, bench/results/nvrtc-compile-split-20261130T140855Z.md): 3.56 s as one program, 1.98 s
    dealt into 2, 3.09 s as 13.

    Raises:
        cupy.cuda.compiler.CompileException: NVRTC refused the source, an option, or a name expression that
            names no kernel of it (the first failing program's log).
        cupy.cuda.driver.CUDADriverError: the driver could not load a compiled image.
    """
    import os
    import tempfile
    from concurrent.futures import ThreadPoolExecutor

    from cupy._core.core import assemble_cupy_compiler_options
    from cupy.cuda import compiler

    opts = assemble_cupy_compiler_options(tuple(options)) + ("-ftz=true",)  # what RawModule(code=...) adds
    arch = compiler._get_arch()  # here: a new thread's current device is device 0, not necessarily ours
    names = list(dict.fromkeys(names))   # a launch plan names at least one kernel
    n = max(1, min(len(names), threads or min(COMPILE_THREADS, _usable_cpus())))
    groups = [names[i::n] for i in range(n)]

    def one(group: list[str]) -> tuple[bytes, dict]:
        image, mapping = compiler.compile_using_nvrtc(source, opts, arch=arch, cache_in_memory=True,
                                                      name_expressions=group)
        return bytes(image), mapping

    with ThreadPoolExecutor(n) as pool:   # one thread a program: every program starts at once
        compiled = list(pool.map(one, groups))
    functions = {}
    for group, (image, mapping) in zip(groups, compiled):
        fd, path = tempfile.mkstemp(suffix=".cubin")  # the worker's private TMPDIR; RawModule(path=) loads a file
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(image)
            module = cp.RawModule(path=path)
            for name in group:
                functions[name] = module.get_function(mapping[name])  # loads the file now
        finally:
            os.unlink(path)
    return [image for image, _ in compiled], functions


class CudaRunner(DeviceClockRunner):
    """One compiled candidate on the current CUDA device.

    Args:
        source: the translation unit; options: NVRTC options (`compile_module` adds CuPy's and the -arch);
        plan: the validated launch plan; definition: the task (names and ABI order).
    Raises:
        KernelCompileError: NVRTC failed (message: its log), a kernel named by the plan is missing, or the
            driver refused to load the compiled module.
        TargetError: CuPy or a device is missing, or compiling failed for a reason that is not the candidate's.
    """

    def __init__(self, source: str, options: list[str], plan: LaunchPlan, definition: Definition):
        try:
            import cupy as cp
        except ImportError as e:
            raise TargetError(f"cupy not installed in the worker's interpreter: {e}") from None
        self.cp = cp
        self.plan, self.definition = plan, definition
        dev = cp.cuda.Device()
        attrs = dev.attributes
        self.max_threads = int(attrs.get("MaxThreadsPerBlock", 1024))
        self.l2_bytes = int(attrs.get("L2CacheSize", 0))
        self.arch = f"sm_{dev.compute_capability}"
        names = plan.kernel_names()
        try:
            self.images, self.functions = compile_module(cp, source, options, names)
        except cp.cuda.compiler.CompileException as e:  # the source, an option, a name that is no kernel of it
            raise KernelCompileError(f"NVRTC ({self.arch}, options {' '.join(options)}):\n{e}") from None
        except cp.cuda.driver.CUDADriverError as e:  # e.g. a kernel whose resources the device cannot give
            raise KernelCompileError(f"loading the compiled module ({self.arch}): {e} (kernels {names})") from None
        except Exception as e:  # ours or CuPy's (a renamed private API, no temp file, no thread): not the kernel's
            raise TargetError(f"the cuda worker could not compile and load the candidate: {type(e).__name__}: "
                              f"{e}") from None
        self._resolved: dict[tuple, list[ResolvedLaunch]] = {}
        self.judge = JudgeKernels(cp)  # poisoning, summaries, comparisons: no CuPy JIT kernels per worker
        self.device_clock = CupyClock(cp, self.judge)

    # -- arguments --------------------------------------------------------------------------------

    def _bind(self, refs: Sequence[ArgRef], copies: int = 1) -> tuple[list[dict], dict, dict, dict[str, int]]:
        """Device arguments for ArgRefs in ABI order: (input sets, outputs, temporaries, axes).
        Each input set maps every input (and scalar) name to its value; outputs: name -> (device array,
        host path); temporaries: name -> device array."""
        cp, d = self.cp, self.definition
        names = list(d.inputs) + list(d.outputs) + list(d.axes)
        if len(refs) != len(names):
            raise TargetError(f"{len(refs)} arguments for {len(names)} ABI slots {names}")
        axes = {a: int(ref.value) for a, ref in zip(names[-len(d.axes):], refs[-len(d.axes):])} if d.axes else {}
        sets: list[dict] = [{} for _ in range(copies)]
        outputs: dict = {}
        for name, ref in zip(names, refs):
            if ref.kind == "scalar":
                spec = d.inputs.get(name)
                is_float = spec is not None and spec.dtype.startswith(("float", "bfloat"))
                value = np.float64(ref.value) if is_float else np.int64(ref.value)
                for s in sets:
                    s[name] = value
            elif ref.writable:
                outputs[name] = (cp.empty(tuple(ref.shape), np.dtype(ref.dtype)), ref.path)
            else:
                host = np.fromfile(ref.path, np.dtype(ref.dtype), count=int(np.prod(ref.shape)))
                host = host.reshape(tuple(ref.shape))
                for s in sets:
                    s[name] = cp.asarray(host)
        temps = {}
        for name, tmp in self.plan.temporaries.items():
            try:
                shape = temporary_shape(tmp, name, axes)
            except PlanError as e:
                raise TargetError(str(e)) from None
            temps[name] = cp.empty(shape, numpy_dtype(tmp.dtype))
        return sets, outputs, temps, axes

    def _launches(self, axes: dict[str, int]) -> list[ResolvedLaunch]:
        key = tuple(sorted(axes.items()))
        if key not in self._resolved:
            try:
                self._resolved[key] = resolve(self.plan, self.definition, axes, self.max_threads)
            except PlanError as e:
                raise TargetError(str(e)) from None
        return self._resolved[key]

    # -- one call ---------------------------------------------------------------------------------

    def _poison(self, outputs: dict, temps: dict) -> None:
        """Outputs and poison-initialised temporaries: floats to NaN, other dtypes to the byte 0xA5 (memsets)."""
        arrays = [a for a, _ in outputs.values()]
        arrays += [temps[n] for n, t in self.plan.temporaries.items() if t.init == "poison"]
        for a in arrays:
            self.judge.poison(a)

    def _run(self, launches: list[ResolvedLaunch], inputs: dict, outputs: dict, temps: dict,
             axes: dict[str, int]) -> None:
        """The launch sequence (what the clock measures): zero-init temporaries, then every launch."""
        for name, tmp in self.plan.temporaries.items():
            if tmp.init == "zero" and temps[name].size:
                self.judge.fill_bytes(temps[name], 0)
        for launch in launches:
            fn = self.functions[launch.kernel]
            opt_in_dynamic_shared(fn, launch.shared_bytes)
            args = tuple(self._arg(name, inputs, outputs, temps, axes) for name in launch.args)
            fn(launch.grid, launch.block, args, shared_mem=launch.shared_bytes)

    @staticmethod
    def _arg(name, inputs, outputs, temps, axes):
        if name in inputs:
            return inputs[name]
        if name in outputs:
            return outputs[name][0]
        if name in temps:
            return temps[name]
        return np.int64(axes[name])

    def _sync(self) -> None:
        self.device_clock.sync()

    @staticmethod
    def _write_back(outputs: dict) -> None:
        for arr, path in outputs.values():
            if arr.size == 0:
                continue
            host = np.memmap(path, dtype=arr.dtype, mode="r+", shape=arr.shape)
            host[...] = arr.get()
            host.flush()
            del host

    def call(self, refs: Sequence[ArgRef]) -> None:
        """One checked call: inputs up, outputs poisoned, the launches, device synchronized, outputs down."""
        (inputs,), outputs, temps, axes = self._bind(refs)
        launches = self._launches(axes)
        self._poison(outputs, temps)
        self._sync()
        self._run(launches, inputs, outputs, temps, axes)
        self._sync()
        self._write_back(outputs)

    # -- timing -----------------------------------------------------------------------------------

    def _summary(self, outputs: dict) -> list[float]:
        """[non-finite count, sum of |x| over finite values] of all outputs, as the cpu worker computes it."""
        return self.judge.summary([arr for arr, _ in outputs.values()])

    def timed(self, refs: Sequence[ArgRef], warmup_refs: Sequence[ArgRef] | None,
              plan) -> tuple[list[float], list[list[float]]]:
        """Warm-up, then timed repeats per ``plan`` (a TimingPlan; the loop: `gpu_timing`). Returns (times in
        ms, output summaries)."""
        (warm_inputs,), warm_out, warm_temps, warm_axes = self._bind(warmup_refs or refs)
        warm_launches = self._launches(warm_axes)
        warm_up(self.device_clock, plan,
                lambda: self._run(warm_launches, warm_inputs, warm_out, warm_temps, warm_axes),
                lambda: self._poison(warm_out, warm_temps))
        warm_inputs = warm_out = warm_temps = None  # freed before the timed sets bind
        sets, outputs, temps, axes = self._bind(refs, rotation_copies(refs, self.device_clock.free_bytes()))
        launches = self._launches(axes)
        times_ms, sums = timed_repeats(
            self.device_clock, plan, self.l2_bytes, len(sets),
            call=lambda i: self._run(launches, sets[i], outputs, temps, axes),
            poison=lambda: self._poison(outputs, temps), summary=lambda: self._summary(outputs))
        self._write_back(outputs)  # the last timed call's outputs: the controller verifies them
        return times_ms, sums


class CupyClock:
    """`gpu_timing.DeviceClock` through CuPy: CUDA events on the current stream, cudaDeviceSynchronize; the
    launch cover is the judge module's spin kernel (``judge``: a `JudgeKernels`)."""

    def __init__(self, cp, judge):
        self.cp = cp
        self.judge = judge
        self._flush = None

    def cover(self, us: float) -> None:
        self.judge.spin(us)

    def event(self):
        return self.cp.cuda.Event()

    def record(self, event) -> None:
        event.record()

    def elapsed_ms(self, start, stop) -> float:
        return self.cp.cuda.get_elapsed_time(start, stop)

    def sync(self) -> None:
        self.cp.cuda.runtime.deviceSynchronize()  # device-wide: every stream, every grid

    def flush(self, nbytes: int, value: float) -> None:
        if self._flush is None or self._flush.nbytes < nbytes:
            self._flush = self.cp.empty(nbytes // 4, self.cp.float32)
        # a memset (no CuPy JIT kernel to compile per worker); the byte changes with the repeat's value
        self._flush.data.memset_async((int(value) * 37 + 1) & 0xFF, self._flush.nbytes)

    def free_bytes(self) -> int:
        return int(self.cp.cuda.runtime.memGetInfo()[0])
