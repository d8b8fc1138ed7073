"""Run a definition's reference implementation (trusted code, run in the parent process).

``reference_backend: numpy`` references get NumPy arrays and return NumPy arrays. ``torch`` references (the
flashinfer-bench convention) get torch tensors on the CPU and need torch installed (``pip install torch==2.13.0``).
"""

from __future__ import annotations

import numpy as np

from ksearch.errors import TaskError
from ksearch.tasks.definition import Definition
from ksearch.tasks.guard import task_code
from ksearch.tasks.inputs import BIT_STORED, to_float64

_COMPILED: dict[str, object] = {}


def _entry(definition: Definition):
    key = definition.reference
    if key not in _COMPILED:
        namespace: dict = {}
        with task_code(f"reference of {definition.name!r} does not load:"):
            exec(compile(definition.reference, f"<reference of {definition.name}>", "exec"), namespace)  # noqa: S102
        if not callable(namespace.get("run")):
            raise TaskError(f"reference of {definition.name!r} defines no function `run`")
        _COMPILED[key] = namespace["run"]
    return _COMPILED[key]


def reference_function(definition: Definition):
    """The reference's ``run`` (compiled once per reference source). Raises TaskError when it does not load."""
    return _entry(definition)


def run_reference(definition: Definition, inputs: dict) -> dict[str, np.ndarray]:
    """Outputs of the reference for these inputs, as float64 NumPy arrays keyed by output name.

    A reference may return its outputs as a tuple or list in the definition's order, a single value (one output),
    or a dict by output name.

    Raises:
        TaskError: the reference fails, returns the wrong number of outputs (or a dict without some output), or
            needs torch that is missing.
    """
    run = _entry(definition)
    names = list(definition.outputs)
    if definition.reference_backend == "torch":
        result = _run_torch(definition, run, inputs)
    else:
        def widen(k):   # native: run widens float16/float32 itself; bfloat16 and float8 bits always need decoding
            return definition.reference_inputs == "float64" or definition.inputs[k].dtype in BIT_STORED
        args = {k: (to_float64(v, definition.inputs[k].dtype) if isinstance(v, np.ndarray) and widen(k) else v)
                for k, v in inputs.items()}
        with task_code(f"reference of {definition.name!r} failed:"):
            result = run(**args)
    if isinstance(result, dict):
        missing = [n for n in names if n not in result]
        if missing:
            raise TaskError(f"reference of {definition.name!r} returned a dict without outputs {missing} (its keys: "
                            f"{sorted(map(str, result))})")
        result = [result[n] for n in names]
    if not isinstance(result, (tuple, list)):
        result = (result,)
    if len(result) != len(names):
        raise TaskError(f"reference of {definition.name!r} returned {len(result)} outputs, definition has {names}")
    return {n: np.asarray(r, np.float64) for n, r in zip(names, result)}


def torch_dtype(dtype: str):
    """The torch dtype of a task dtype (``float8_e4m3fn`` -> ``torch.float8_e4m3fn``). Raises KeyError for one
    torch lacks (float4_e2m1), ImportError without torch."""
    import torch

    return getattr(torch, dtype)


def torch_args(definition: Definition, inputs: dict, device: str = "cpu") -> dict:
    """The inputs as torch tensors of the definition's dtypes on ``device`` (NumPy arrays copied; bfloat16 and
    float8 viewed from their stored bits, not converted); scalars as they are.

    Raises:
        TaskError: torch is missing.
    """
    try:
        import torch
    except ImportError:
        raise TaskError(f"the reference of {definition.name!r} uses PyTorch; install it with "
                        "`pip install torch==2.13.0` (CPU build)") from None
    tdt = {"float32": torch.float32, "float16": torch.float16, "float64": torch.float64, "int64": torch.int64,
           "int32": torch.int32, "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool}
    bits = {"bfloat16": (np.int16, torch.bfloat16), "float8_e4m3fn": (np.uint8, torch.float8_e4m3fn),
            "float8_e5m2": (np.uint8, torch.float8_e5m2)}  # stored as raw bits: viewed, not converted
    args = {}
    for k, v in inputs.items():
        dtype = definition.inputs[k].dtype
        if not isinstance(v, np.ndarray):
            args[k] = v
        elif dtype in bits:
            args[k] = torch.from_numpy(v.view(bits[dtype][0]).copy()).view(bits[dtype][1]).to(device)
        else:
            args[k] = torch.from_numpy(v.copy()).to(tdt[dtype]).to(device)
    return args


def _run_torch(definition: Definition, run, inputs: dict):
    import torch

    args = torch_args(definition, inputs)
    with task_code(f"reference of {definition.name!r} failed:"), torch.no_grad():
        result = run(**args)
    def widen(r):
        return r.detach().to(torch.float64).numpy() if hasattr(r, "detach") else r

    if isinstance(result, dict):
        return {k: widen(r) for k, r in result.items()}
    if not isinstance(result, (tuple, list)):
        result = (result,)
    return [widen(r) for r in result]
