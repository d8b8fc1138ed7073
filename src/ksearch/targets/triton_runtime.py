"""The triton target inside the worker: import the candidate module, torch CUDA tensors, calls and GPU timing.

Imported only in the worker (it imports torch and Triton). The worker hands it the same argument references
as for the cpu and cuda targets (input files mapped from the controller, output files the controller
compares) and gets back what they return: nothing for a plain call, (times in ms, output summaries) for a
timing request.

Per call: inputs copied host -> device (once per input set), outputs NaN-poisoned (0xA5 bytes for integers)
on the device, ``run(inputs..., outputs...)`` called, the whole device synchronized, outputs copied back to the
output files. Triton compiles a kernel at its first call with new argument properties (dtypes, alignment,
integers equal to 1 or divisible by 16): that happens in a check call, and the timing always warms up at
least once on the same workload first, so compile time is never timed. Timing is `gpu_timing`'s loop, the
cuda target's: torch CUDA events on the current stream around the call, L2 flushed and outputs re-poisoned
between repeats, timed inputs rotated among device copies at distinct addresses.

The candidate's Python runs in this process, inside the timed region (its launch overhead is part of its
time, as it would be in a model). What keeps it honest beyond the static rules (eval/static_rules/triton.yaml):

- a torch dispatch guard (`TorchComputeGuard`) armed while the module imports and while ``run`` runs: any
  torch operation on the GPU other than allocating, filling, viewing and copying buffers (`ALLOWED_OPS`), and
  any copy of device data to the host, is recorded, and the call is REJECTED afterwards (however the
  candidate caught exceptions). Triton launches do not go through torch's dispatcher, so they are not seen.
- the clock and synchronization functions are bound before the module is imported, and after every call
  (outside the clock) the judge checks that the guard is still installed, that ``torch.cuda.synchronize``,
  ``current_stream``, ``Event``, ``Event.record`` and ``Event.elapsed_time`` are still the originals and
  that the current stream is still the one the events are recorded on; otherwise REJECTED.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ksearch.errors import CandidateError, KernelCompileError, KernelRejected, TargetError
from ksearch.protocol import ArgRef
from ksearch.targets.base import DeviceClockRunner
from ksearch.targets.gpu_timing import rotation_copies, timed_repeats, torch_spin, warm_up
from ksearch.tasks.definition import Definition

#: aten operators ``run`` may cause on the GPU: allocating, filling, viewing, copying buffers. Anything else
#: (arithmetic, reductions, scans, matmuls, ...) is torch computing, not a Triton kernel: REJECTED.
ALLOWED_OPS = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like", "new_zeros",
    "zero_", "ones", "ones_like", "new_ones", "full", "full_like", "new_full", "fill_", "scalar_tensor",
    "view", "_unsafe_view", "_reshape_alias", "reshape", "view_as", "as_strided", "t", "transpose", "permute",
    "unsqueeze", "squeeze", "expand", "expand_as", "select", "slice", "narrow", "split", "split_with_sizes",
    "unbind", "chunk", "flatten", "unflatten", "movedim", "alias", "detach", "contiguous", "copy_", "clone",
    "_to_copy", "lift_fresh", "lift_fresh_copy",
})

#: copies that would bring device data to the host (fingerprinting inputs, computing the answer on the CPU)
_COPIES = frozenset({"copy_", "_to_copy", "clone"})

_TORCH_DTYPES = ("float32", "float16", "bfloat16", "float64", "int32", "int64", "int16", "int8", "uint8", "bool")


def _leaves(obj):
    if isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _leaves(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _leaves(x)
    else:
        yield obj


def _op_name(func) -> str:
    """``cumsum`` for ``aten.cumsum.default``."""
    return getattr(getattr(func, "overloadpacket", None), "__name__", None) or str(func)


def _is_cuda_device(dev) -> bool:
    return dev is not None and str(dev).startswith("cuda")


def violation(torch, name: str, args, kwargs) -> str | None:
    """Why the aten operator ``name`` with these arguments is not allowed in ``run``, or None.

    Not allowed: an operator outside ALLOWED_OPS that touches the GPU (a CUDA tensor among its arguments, or a
    CUDA ``device`` keyword), and a copy from a CUDA tensor to a CPU one."""
    tensors = [x for x in _leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
    on_gpu = any(t.is_cuda for t in tensors) or _is_cuda_device(kwargs.get("device"))
    if not on_gpu:
        return None
    if name not in ALLOWED_OPS:
        return f"aten.{name}"
    if name in _COPIES:
        src_gpu = any(t.is_cuda for t in tensors[1 if name == "copy_" else 0:][:1])
        dst_cpu = (name == "copy_" and tensors and not tensors[0].is_cuda) or \
            (name != "copy_" and "device" in kwargs and not _is_cuda_device(kwargs["device"]))
        if src_gpu and dst_cpu:
            return f"aten.{name} to the host"
    return None


def _guard_class(torch):
    from torch.utils._python_dispatch import TorchDispatchMode

    class TorchComputeGuard(TorchDispatchMode):
        """Records the torch operations on the GPU that ``run`` may not cause, while ``armed``."""

        def __init__(self):
            super().__init__()
            self.armed = False
            self.violations: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if self.armed:
                why = violation(torch, _op_name(func), args, kwargs)
                if why and why not in self.violations and len(self.violations) < 8:
                    self.violations.append(why)
            return func(*args, **kwargs)

    return TorchComputeGuard


class TorchClock:
    """`gpu_timing.DeviceClock` through torch; its functions are bound when it is made (before the candidate
    is imported), so a candidate that patches torch.cuda later changes nothing here."""

    def __init__(self, torch, device):
        self.device = device
        self._new_event = torch.cuda.Event
        self._record = torch.cuda.Event.record
        self._elapsed = torch.cuda.Event.elapsed_time
        self._sync = torch.cuda.synchronize
        self._mem_get_info = torch.cuda.mem_get_info
        self._empty, self._f32 = torch.empty, torch.float32
        self._flush = None
        # torch's spin kernel (a busy loop of the given clock cycles; private but present since torch 1.x)
        self._spin = torch_spin(torch)

    def event(self):
        return self._new_event(enable_timing=True)

    def record(self, event) -> None:
        self._record(event)

    def elapsed_ms(self, start, stop) -> float:
        return self._elapsed(start, stop)

    def sync(self) -> None:
        self._sync()  # cudaDeviceSynchronize: every stream of the device

    def flush(self, nbytes: int, value: float) -> None:
        if self._flush is None or self._flush.numel() * 4 < nbytes:
            self._flush = self._empty(nbytes // 4, dtype=self._f32, device=self.device)
        self._flush.fill_(value)

    def cover(self, us: float) -> None:
        self._spin(us)

    def free_bytes(self) -> int:
        return int(self._mem_get_info()[0])


class TritonRunner(DeviceClockRunner):
    """One imported candidate module on the current CUDA device.

    Args:
        artifact: the module's file (written by `TritonTarget.compile`); entry: the function to call;
        definition: the task (names, dtypes, ABI order); source_name: the candidate's file name, for messages.
    Raises:
        KernelCompileError: the module does not import, or ``entry`` is not a function in it.
        TargetError: torch, Triton or a CUDA device is missing.
    """

    def __init__(self, artifact: Path, entry: str, definition: Definition, source_name: str = "kernel.py"):
        try:
            import torch
            import triton  # noqa: F401
        except ImportError as e:
            raise TargetError(f"torch and triton must be installed in the worker's interpreter: {e}") from None
        if not torch.cuda.is_available():
            raise TargetError("no CUDA device visible to torch in the worker")
        self.torch, self.definition = torch, definition
        self.artifact, self.source_name = Path(artifact), source_name
        self.device = torch.device("cuda", torch.cuda.current_device())
        props = torch.cuda.get_device_properties(self.device)
        self.l2_bytes = int(getattr(props, "L2_cache_size", 0) or 0)
        self.device_clock = TorchClock(torch, self.device)
        self._pinned = [(torch.cuda, "synchronize"), (torch.cuda, "current_stream"), (torch.cuda, "Event"),
                        (torch.cuda.Event, "record"), (torch.cuda.Event, "elapsed_time")]
        self._pinned = [(owner, attr, getattr(owner, attr)) for owner, attr in self._pinned]
        self._stream = torch.cuda.current_stream().cuda_stream
        from torch.utils._python_dispatch import _get_current_dispatch_mode

        self._current_mode = _get_current_dispatch_mode
        self.guard = _guard_class(torch)()
        self.guard.__enter__()  # for the worker's lifetime; armed only around the candidate's code
        self._compile_errors = _compile_error_types()
        module = self._import()
        fn = getattr(module, entry, None)
        if not callable(fn):
            raise KernelCompileError(f"{source_name} defines no function {entry!r} (the entry point)")
        self.entry = fn
        self._dtypes = {name: spec.dtype for name, spec in list(definition.inputs.items()) +
                        list(definition.outputs.items())}

    def _import(self):
        name = f"ksearch_candidate_{os.getpid()}"
        spec = importlib.util.spec_from_file_location(name, str(self.artifact))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        self.guard.armed = True
        try:
            spec.loader.exec_module(module)
        except (Exception, SystemExit) as e:
            raise KernelCompileError(f"{self.source_name} does not import:\n{self._format(e)}") from None
        finally:
            self.guard.armed = False
        self._check()
        return module

    # -- messages ---------------------------------------------------------------------------------

    def _format(self, e: BaseException, limit: int = 12) -> str:
        """The exception with the candidate's frames only, its file named as the candidate names it."""
        frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == str(self.artifact)]
        lines = [f"  {self.source_name}:{f.lineno} in {f.name}: {(f.line or '').strip()}" for f in frames[-limit:]]
        text = "".join(traceback.format_exception_only(type(e), e)).strip()
        return "\n".join(lines + [text.replace(str(self.artifact), self.source_name)])

    # -- arguments --------------------------------------------------------------------------------

    def _torch_dtype(self, name: str):
        dt = self._dtypes[name]
        if dt not in _TORCH_DTYPES:
            raise TargetError(f"dtype {dt!r} of {name!r} has no torch equivalent here (supported: {_TORCH_DTYPES})")
        return getattr(self.torch, dt)

    def _bind(self, refs: Sequence[ArgRef], copies: int = 1) -> tuple[list[list], dict]:
        """Device arguments for ArgRefs in ABI order: (input sets: each the inputs in order, outputs: name ->
        (tensor, host path)). Axes are not passed: ``run`` reads them from the shapes."""
        torch, d = self.torch, self.definition
        names = list(d.inputs) + list(d.outputs) + list(d.axes)
        if len(refs) != len(names):
            raise TargetError(f"{len(refs)} arguments for {len(names)} ABI slots {names}")
        sets: list[list] = [[] for _ in range(copies)]
        outputs: dict = {}
        for name, ref in zip(names, refs):
            if name in d.axes:
                continue
            if ref.kind == "scalar":
                is_float = self._dtypes[name].startswith(("float", "bfloat"))
                for s in sets:
                    s.append(float(ref.value) if is_float else int(ref.value))
                continue
            shape, dtype = tuple(ref.shape), self._torch_dtype(name)
            if ref.writable:
                outputs[name] = (torch.empty(shape, dtype=dtype, device=self.device), ref.path)
                continue
            nbytes = int(np.prod(shape)) * np.dtype(ref.dtype).itemsize
            host = torch.from_numpy(np.fromfile(ref.path, np.uint8, count=nbytes))
            for s in sets:  # each copy at its own device address
                s.append(host.to(self.device).view(dtype).reshape(shape))
        return sets, outputs

    def _poison(self, outputs: dict) -> None:
        for t, _ in outputs.values():
            if t.numel() == 0:
                continue
            if t.is_floating_point():
                t.fill_(float("nan"))
            else:
                t.view(self.torch.uint8).fill_(0xA5)

    def _write_back(self, outputs: dict) -> None:
        for t, path in outputs.values():
            if t.numel() == 0:
                continue
            data = t.contiguous().view(self.torch.uint8).reshape(-1).cpu().numpy()
            host = np.memmap(path, dtype=np.uint8, mode="r+", shape=data.shape)
            host[...] = data
            host.flush()
            del host

    # -- one call ---------------------------------------------------------------------------------

    def _invoke(self, inputs: list, outputs: dict) -> None:
        """The candidate's call (what the clock measures), guard armed."""
        self.guard.armed = True
        try:
            self.entry(*inputs, *(t for t, _ in outputs.values()))
        except self._compile_errors as e:
            raise KernelCompileError(f"Triton could not compile a kernel of {self.source_name}:\n"
                                     f"{self._format(e)}") from None
        except Exception as e:
            raise CandidateError(self._format(e)) from None
        finally:
            self.guard.armed = False

    def _check(self) -> None:
        """After the candidate ran (outside the clock): REJECTED if it computed with torch or patched the
        judge's torch."""
        if self.guard.violations:
            raise KernelRejected(f"{self.source_name} computed with torch on the GPU ({', '.join(self.guard.violations)})"
                                 ": the triton target judges Triton kernels; torch may only allocate, fill, view and "
                                 "copy buffers (docs/triton-target.md)")
        if self._current_mode() is not self.guard:
            raise KernelRejected(f"{self.source_name} removed the judge's torch dispatch guard")
        for owner, attr, original in self._pinned:
            if getattr(owner, attr, None) is not original:
                raise KernelRejected(f"{self.source_name} replaced {getattr(owner, '__name__', owner)}.{attr}, "
                                     "which the judge times with")
        if self.torch.cuda.current_stream().cuda_stream != self._stream:
            raise KernelRejected(f"{self.source_name} changed the current CUDA stream (the timing events are "
                                 "recorded on the judge's)")

    def call(self, refs: Sequence[ArgRef]) -> None:
        """One checked call: inputs up, outputs poisoned, run(), device synchronized, outputs down."""
        (inputs,), outputs = self._bind(refs)
        self._poison(outputs)
        self.device_clock.sync()
        self._invoke(inputs, outputs)
        self.device_clock.sync()
        self._check()
        self._write_back(outputs)

    # -- timing -----------------------------------------------------------------------------------

    def _summary(self, outputs: dict) -> list[float]:
        """[non-finite count, sum of |x| over finite values] of all outputs, as the cpu worker computes it."""
        torch = self.torch
        bad, total = 0, 0.0
        for t, _ in outputs.values():
            if t.numel() == 0:
                continue
            x = t.to(torch.float64)
            if t.is_floating_point():
                finite = torch.isfinite(x)
                bad += int(t.numel() - int(finite.sum()))
                total += float(x.abs().masked_fill(~finite, 0.0).sum())
            else:
                total += float(x.sum())
        return [bad, total]

    def _checked_summary(self, outputs: dict) -> list[float]:
        self._check()
        return self._summary(outputs)

    def timed(self, refs: Sequence[ArgRef], warmup_refs: Sequence[ArgRef] | None,
              plan) -> tuple[list[float], list[list[float]]]:
        """Warm-up (at least one call: never time a JIT compile), then timed repeats per ``plan`` (a TimingPlan;
        the loop: `gpu_timing`). Returns (times in ms, output summaries)."""
        (warm_inputs,), warm_out = self._bind(warmup_refs or refs)
        warm_up(self.device_clock, plan, lambda: self._invoke(warm_inputs, warm_out), lambda: self._poison(warm_out),
                least=1)
        self._check()
        warm_inputs = warm_out = None  # freed before the timed sets bind
        sets, outputs = self._bind(refs, rotation_copies(refs, self.device_clock.free_bytes()))
        times_ms, sums = timed_repeats(
            self.device_clock, plan, self.l2_bytes, len(sets),
            call=lambda i: self._invoke(sets[i], outputs),
            poison=lambda: self._poison(outputs), summary=lambda: self._checked_summary(outputs))
        self._write_back(outputs)  # the last timed call's outputs: the controller verifies them
        return times_ms, sums


def _compile_error_types() -> tuple[type, ...]:
    """Triton's exceptions for a kernel that does not compile (the language, ptxas, resources)."""
    found = []
    for module, name in (("triton.compiler.errors", "CompilationError"), ("triton.runtime.errors", "PTXASError"),
                         ("triton.runtime.errors", "OutOfResources")):
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            pass
    return tuple(found)
