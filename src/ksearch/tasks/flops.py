"""FLOPs of a torch reference, counted by PyTorch's own FLOP counter, for tasks that give no cost model.

A task from elsewhere (a flashinfer-bench definition, a KernelBench problem, a GPU MODE folder) says nothing of
the work it does, so its roofline floor would count bytes only (a GEMM's floor 16x too low). Where its reference
is torch, `count_flops` runs the reference once per workload under ``torch.utils.flop_counter.FlopCounterMode``:
first on ``meta`` tensors of the workload's shapes and dtypes (no memory, no arithmetic: instant whatever the
sizes), and where the reference cannot run there (it reads input data: ``.item()``, paged-attention index arrays)
on the workload's real inputs for seed 0 (`ksearch.tasks.inputs.make_inputs`; as much as one correctness check
costs; refused above `REAL_INPUT_BYTES` of inputs and outputs rather than allocated). Each attempt is stopped
after `COUNT_SECONDS` (a reference that hangs, or never returns), and a reference that raises or calls
``sys.exit`` gives bytes only with the reason. The counts are cached per (reference, workload shapes) in this
process.

What the counter counts: matrix products and convolutions (``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``convolution``
and their backward, scaled dot-product attention), 2 FLOPs per multiply-add; elementwise ops, reductions and
transcendentals count 0 (torch/utils/flop_counter.py, PyTorch 2.x). So the floor it gives is a lower bound: right
for the GEMM-like tasks where the compute term matters, never above the true work, which is what the judge's
too-fast check needs (a floor above the truth would reject correct kernels).

The FLOPs run on the matrix units of the inputs' widest floating dtype (``tensor_float16`` for float16 inputs,
``tensor_tf32`` for float32: the fastest rate a correct kernel could reach, again a lower bound on time; a CPU spec
answers a tensor key with its vector peak: `ksearch.hardware.roofline.peak_for`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ksearch.errors import TaskError, TaskTimeout
from ksearch.tasks.definition import Definition, Workload
from ksearch.tasks.guard import task_code

#: task dtype of the floating inputs -> the ``peak_flops`` key their matrix products can reach
TENSOR_KEYS = {"float64": "tensor_float64", "float32": "tensor_tf32", "float16": "tensor_float16",
               "bfloat16": "tensor_bfloat16", "float8_e4m3fn": "tensor_float8", "float8_e5m2": "tensor_float8"}
#: the keys above from the widest dtype down: the inputs' first one present names the rate
_WIDEST_FIRST = ("float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")

#: the most bytes (inputs and outputs by their shapes) a workload may have to be counted on real inputs
REAL_INPUT_BYTES = 512 * 2**20
#: seconds one attempt (meta tensors, then real inputs) may run under the counter
COUNT_SECONDS = 20.0

#: the counter's name, as the report shows the source of a floor
SOURCE = "flops: torch FlopCounterMode on the reference"


@dataclass(frozen=True)
class FlopCount:
    """The counted ``flops`` of one workload (None where they could not be counted: ``note`` says why),
    ``flops_on`` (the ``peak_flops`` key they run on) and ``how`` (``meta`` tensors or ``real`` inputs)."""

    flops: float | None
    flops_on: str = "float32"
    how: str = ""
    note: str = ""


_CACHE: dict[tuple, FlopCount] = {}
#: reference source -> why it is not counted again: it ran past COUNT_SECONDS once
_TIMED_OUT: dict[str, str] = {}


def flops_on(definition: Definition) -> str:
    """The ``peak_flops`` key for a reference's counted FLOPs: the matrix-unit key of its widest floating input
    dtype (`TENSOR_KEYS`), ``float32`` with no floating input."""
    dtypes = {s.dtype for s in definition.inputs.values() if s.shape is not None}
    return next((TENSOR_KEYS[d] for d in _WIDEST_FIRST if d in dtypes), "float32")


def count_flops(definition: Definition, workload: Workload) -> FlopCount:
    """The FLOPs torch's FlopCounterMode counts for one call of the definition's torch reference on this
    workload (see the module docstring); cached. Never raises for a reference that fails or torch missing: the
    count is then None with the reason.

    Raises:
        TaskError: the workload breaks the definition (`Definition.axis_values`).
    """
    values = definition.axis_values(workload)
    scalars = {k: getattr(v, "value", None) for k, v in workload.inputs.items()}
    specs = {k: (s.shape, s.dtype) for k, s in definition.inputs.items()}
    key = (definition.reference, json.dumps([specs, sorted(values.items()), sorted(scalars.items())], default=str))
    if key not in _CACHE:
        _CACHE[key] = _count(definition, workload, values)
    return _CACHE[key]


def _count(definition: Definition, workload: Workload, values: dict[str, int]) -> FlopCount:
    try:
        import torch
        from torch.utils.flop_counter import FlopCounterMode
    except ImportError:
        return FlopCount(None, note="torch is not installed")
    from ksearch.tasks.reference import reference_function

    on = flops_on(definition)
    if definition.reference in _TIMED_OUT:  # once per reference, not COUNT_SECONDS for every workload
        return FlopCount(None, on, note=_TIMED_OUT[definition.reference])
    try:
        with task_code("the reference does not load:", COUNT_SECONDS, late="the reference did not load"):
            run = reference_function(definition)
    except TaskTimeout as e:
        note = _TIMED_OUT[definition.reference] = str(e)
        return FlopCount(None, on, note=note)
    except TaskError as e:  # a reference that does not load: the check will say so; bytes only
        return FlopCount(None, on, note=str(e))

    def counted(args: dict) -> float:
        counter = FlopCounterMode(display=False)
        with torch.no_grad(), counter:
            run(**args)
        return float(counter.get_total_flops())

    late = "the reference did not finish"
    try:
        with task_code("on meta tensors:", COUNT_SECONDS, late=late):
            return FlopCount(counted(_meta_args(definition, workload, values)), on, "meta")
    except TaskTimeout as e:
        note = _TIMED_OUT[definition.reference] = str(e)
        return FlopCount(None, on, note=note)
    except TaskError as e:  # reads its data or makes tensors elsewhere: real inputs below
        on_meta = str(e).removeprefix("on meta tensors: ")[:50]
    nbytes = definition.bytes_of(workload)
    if nbytes > REAL_INPUT_BYTES:
        return FlopCount(None, on, note=f"not on meta tensors ({on_meta}), and {nbytes / 2**20:.0f} MiB of inputs "
                                        f"and outputs, over the {REAL_INPUT_BYTES // 2**20} MiB drawn to count")
    from ksearch.tasks.inputs import make_inputs
    from ksearch.tasks.reference import torch_args

    try:
        with task_code("the reference did not run under the counter:", COUNT_SECONDS, late=late):
            return FlopCount(counted(torch_args(definition, make_inputs(definition, workload, 0))), on, "real")
    except TaskTimeout as e:
        note = _TIMED_OUT[definition.reference] = str(e)
        return FlopCount(None, on, note=note)
    except TaskError as e:
        return FlopCount(None, on, note=str(e))


def _meta_args(definition: Definition, workload: Workload, values: dict[str, int]) -> dict:
    """The reference's arguments as ``meta`` tensors of the workload's shapes and dtypes; scalars the workload
    gives as they are. Raises ValueError for a scalar the workload leaves to chance (real inputs are used)."""
    import torch

    from ksearch.tasks.reference import torch_dtype

    args: dict = {}
    for name, spec in definition.inputs.items():
        shape = definition.shape_of(spec, values)
        if shape is None:
            given = getattr(workload.inputs.get(name), "value", None)
            if given is None:
                raise ValueError(f"scalar input {name!r} has no value in the workload")
            args[name] = given
        else:
            args[name] = torch.empty(shape, dtype=torch_dtype(spec.dtype), device="meta")
    return args
