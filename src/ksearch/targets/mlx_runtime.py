"""The mlx targets inside the worker: build the MLX custom kernel, MLX arrays, calls and timing.

Imported only in the worker (it imports MLX). The worker hands it the argument references the other device
targets get (input files mapped from the controller, output files the controller compares).

Per call: inputs copied to MLX arrays (once per input set), the kernel called with the task's axes and the
launch's ``template`` as int template constants, ``mx.eval`` on its outputs (MLX is lazy: nothing runs until
then), ``mx.synchronize()``, outputs copied back. Check calls pass ``init_value=NaN`` so an output element the
kernel never writes reads NaN (MLX's allocator would otherwise hand back a buffer that may still hold the
previous call's correct answer).

Timing (``gpu_timing``'s loop, as the cuda and triton targets): MLX's Python API has no device events, so
the clock is the host's ``perf_counter`` after a device-wide ``mx.synchronize()``; the timed region is what
a model pays per call: building the kernel's graph node, the launch and the kernel, until ``mx.eval``
returns. Timed calls do not pass ``init_value`` (a fill would be timed); instead, outside the clock, arrays of
the outputs' sizes are filled with NaN and freed, so the allocator's cached buffers hold NaN, and every timed
call's output summary is compared by the controller with the verified one. L2 (or the SLC on Apple GPUs) is
flushed between repeats by writing a buffer of at least twice `ASSUMED_CACHE_BYTES`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np

from ksearch.errors import KernelCompileError, PlanError, TargetError
from ksearch.protocol import ArgRef
from ksearch.targets.base import DeviceClockRunner
from ksearch.targets.gpu_timing import rotation_copies, timed_repeats, warm_up
from ksearch.targets.mlx import BACKENDS, parse_launch, resolve_launch
from ksearch.tasks.definition import Definition

#: the last-level cache the flush must evict when the device does not say: an H200's L2 is 50 MB, an M-series
#: Max's system-level cache up to 48-96 MB (docs/hardware-catalog.md)
ASSUMED_CACHE_BYTES = 96 << 20


class WallClock:
    """`gpu_timing.DeviceClock` for MLX: host time after a device-wide synchronization."""

    def __init__(self, mx):
        self.mx = mx
        self._flush = None

    def event(self):
        return [0.0]

    def record(self, event) -> None:
        self.mx.synchronize()
        event[0] = time.perf_counter()

    def elapsed_ms(self, start, stop) -> float:
        return (stop[0] - start[0]) * 1e3

    def sync(self) -> None:
        self.mx.synchronize()

    def cover(self, us: float) -> None:
        """Nothing: this clock is the host's, read after a synchronization, so launch overhead is timed."""

    def flush(self, nbytes: int, value: float) -> None:
        mx = self.mx
        self._flush = mx.full((max(nbytes // 4, 1),), value, dtype=mx.float32)
        mx.eval(self._flush)

    def free_bytes(self) -> int:
        mx = self.mx
        try:
            info = mx.device_info()
            total = int(info.get("memory_size") or info.get("total_memory") or 0)
        except Exception:
            total = 0
        used = int(mx.get_active_memory()) if hasattr(mx, "get_active_memory") else 0
        return max(total - used, 0) if total else 4 << 30


class MlxRunner(DeviceClockRunner):
    """One MLX custom kernel (a candidate's artifact) on this machine's MLX GPU backend.

    Args:
        payload: the artifact `MlxTarget.compile` wrote (target, header, body, launch, kernel_name).
        definition: the task (names, dtypes, order).
    Raises:
        TargetError: MLX or the backend is missing; a dtype MLX cannot take from NumPy here (bfloat16).
    """

    def __init__(self, payload: dict, definition: Definition):
        try:
            import mlx.core as mx
        except ImportError as e:
            raise TargetError(f"mlx must be installed in the worker's interpreter: {e}") from None
        self.mx, self.definition = mx, definition
        self.target = payload["target"]
        self.backend = BACKENDS[self.target]
        ok = mx.metal.is_available() if self.backend == "metal" else mx.cuda.is_available()
        if not ok:
            raise TargetError(f"MLX's {self.backend} backend is not available in the worker")
        mx.set_default_device(mx.gpu)
        self.header, self.body, self.name = payload["header"], payload["body"], payload["kernel_name"]
        try:
            self.plan = parse_launch(payload["launch"], definition, self.target)
        except PlanError as e:
            raise KernelCompileError(str(e)) from None
        self.inputs, self.outputs = list(definition.inputs), list(definition.outputs)
        for name, spec in list(definition.inputs.items()) + list(definition.outputs.items()):
            if spec.dtype == "bfloat16":
                raise TargetError(f"{name}: bfloat16 cannot be moved between NumPy and MLX here")
        self._kernels: dict[int, object] = {}  # shared_memory -> MLX kernel function
        self._compiled: set = set()  # resolved launches that have run once (MLX compiled them)
        # NaN init only where every output is a float (integers have no NaN)
        self._float_outputs = all(np.dtype(s.dtype).kind == "f" for s in definition.outputs.values())
        self.device_clock = WallClock(mx)
        self.l2_bytes = ASSUMED_CACHE_BYTES

    # -- kernel -----------------------------------------------------------------------------------

    def _kernel(self, shared: int):
        if shared not in self._kernels:
            mx = self.mx
            if self.backend == "metal":
                fn = mx.fast.metal_kernel(name=self.name, input_names=self.inputs, output_names=self.outputs,
                                          source=self.body, header=self.header, ensure_row_contiguous=True)
            else:
                fn = mx.fast.cuda_kernel(name=self.name, input_names=self.inputs, output_names=self.outputs,
                                         source=self.body, header=self.header, ensure_row_contiguous=True,
                                         shared_memory=shared)
            self._kernels[shared] = fn
        return self._kernels[shared]

    # -- arguments --------------------------------------------------------------------------------

    def _bind(self, refs: Sequence[ArgRef], copies: int = 1):
        """(input sets: each the MLX inputs in order, output specs: name -> (shape, dtype, host path), axes)."""
        mx, d = self.mx, self.definition
        names = list(d.inputs) + list(d.outputs) + list(d.axes)
        if len(refs) != len(names):
            raise TargetError(f"{len(refs)} arguments for {len(names)} ABI slots {names}")
        axes = {a: int(ref.value) for a, ref in zip(names, refs) if a in d.axes}
        sets: list[list] = [[] for _ in range(copies)]
        outputs: dict = {}
        for name, ref in zip(names, refs):
            if name in d.axes:
                continue
            if ref.kind == "scalar":
                value = np.asarray(ref.value, dtype=np.dtype(d.inputs[name].dtype))
                for s in sets:
                    s.append(mx.array(value))
                continue
            shape, dtype = tuple(ref.shape), np.dtype(ref.dtype)
            if ref.writable:
                outputs[name] = (shape, getattr(mx, d.outputs[name].dtype), ref.path)
                continue
            host = np.fromfile(ref.path, dtype, count=int(np.prod(shape))).reshape(shape)
            for s in sets:  # each copy its own MLX buffer
                s.append(mx.array(host))
        for s in sets:
            mx.eval(s)
        return sets, outputs, axes

    def _launch(self, axes: dict[str, int]):
        try:
            return resolve_launch(self.plan, axes)
        except PlanError as e:
            raise TargetError(str(e)) from None

    # -- one call ---------------------------------------------------------------------------------

    def _call_args(self, outputs: dict, launch, poison: bool) -> dict:
        """The kernel call's keyword arguments, built outside the clock. ``poison``: outputs start as NaN (where
        every output is a float: integers have no NaN)."""
        kwargs = {"template": list(launch.template), "grid": launch.grid, "threadgroup": launch.threadgroup,
                  "output_shapes": [s for s, _, _ in outputs.values()],
                  "output_dtypes": [t for _, t, _ in outputs.values()]}
        if poison and self._float_outputs:
            kwargs["init_value"] = float("nan")
        return kwargs

    def _invoke(self, inputs: list, launch, kwargs: dict) -> list:
        """The kernel on ``inputs``, evaluated: what the clock measures."""
        mx = self.mx
        fn = self._kernel(launch.shared_memory)
        first = launch not in self._compiled
        try:
            outs = fn(inputs=inputs, **kwargs)
            mx.eval(outs)
        except Exception as e:
            if first:  # MLX compiles at the first evaluation of a launch: its errors are the compiler's
                raise KernelCompileError(f"MLX could not build or launch the {self.backend} kernel: "
                                         f"{type(e).__name__}: {e}") from None
            raise
        self._compiled.add(launch)
        return outs

    def _write_back(self, outputs: dict, outs: list) -> None:
        for (shape, _, path), arr in zip(outputs.values(), outs):
            if math.prod(shape) == 0:
                continue
            data = np.ascontiguousarray(np.array(arr)).view(np.uint8).reshape(-1)
            host = np.memmap(path, dtype=np.uint8, mode="r+", shape=data.shape)
            host[...] = data
            host.flush()
            del host

    def call(self, refs: Sequence[ArgRef]) -> None:
        """One checked call: inputs up, outputs NaN-initialised, the kernel, outputs down."""
        (inputs,), outputs, axes = self._bind(refs)
        launch = self._launch(axes)
        outs = self._invoke(inputs, launch, self._call_args(outputs, launch, poison=True))
        self.mx.synchronize()
        self._write_back(outputs, outs)

    # -- timing -----------------------------------------------------------------------------------

    def _dirty(self, outputs: dict) -> None:
        """NaN-filled arrays of the outputs' sizes, evaluated and freed: the buffers MLX's allocator hands the
        next call's outputs hold NaN, not an earlier answer."""
        mx = self.mx
        junk = [mx.full(shape, float("nan"), dtype=dt) for shape, dt, _ in outputs.values()
                if math.prod(shape) and mx.issubdtype(dt, mx.floating)]
        mx.eval(junk)
        del junk

    @staticmethod
    def _summary(outs: list) -> list[float]:
        """[non-finite count, sum of |x| over finite values] of all outputs, as the cpu worker computes it."""
        bad, total = 0, 0.0
        for arr in outs:
            x = np.array(arr).astype(np.float64)
            if x.size == 0:
                continue
            finite = np.isfinite(x)
            bad += int(x.size - np.count_nonzero(finite))
            total += float(np.abs(np.where(finite, x, 0.0)).sum())
        return [bad, total]

    def timed(self, refs: Sequence[ArgRef], warmup_refs: Sequence[ArgRef] | None,
              plan) -> tuple[list[float], list[list[float]]]:
        """Warm-up (at least one call, so MLX's compile is never timed), then timed repeats per ``plan``
        (`gpu_timing.timed_repeats`). Returns (times in ms, output summaries)."""
        (warm_inputs,), warm_out, warm_axes = self._bind(warmup_refs or refs)
        warm_launch = self._launch(warm_axes)
        warm_args = self._call_args(warm_out, warm_launch, poison=True)
        warm_up(self.device_clock, plan, lambda: self._invoke(warm_inputs, warm_launch, warm_args),
                lambda: None, least=1)
        sets, outputs, axes = self._bind(refs, rotation_copies(refs, self.device_clock.free_bytes()))
        launch = self._launch(axes)
        self._invoke(sets[0], launch, self._call_args(outputs, launch, poison=True))  # compiles, outside the clock
        timed_args = self._call_args(outputs, launch, poison=False)
        last: list = []

        def call(i: int) -> None:
            last[:] = self._invoke(sets[i], launch, timed_args)

        times_ms, sums = timed_repeats(self.device_clock, plan, self.l2_bytes, len(sets), call=call,
                                       poison=lambda: self._dirty(outputs), summary=lambda: self._summary(last))
        self._write_back(outputs, last)  # the last timed call's outputs: the controller verifies them
        return times_ms, sums
