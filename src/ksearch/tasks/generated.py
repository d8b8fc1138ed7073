"""Inputs and checks a task writes as Python: a definition's ``input_generator`` and ``checker`` sources.

The KernelBench and GPU MODE importers (`ksearch.tasks.kernelbench`, `ksearch.tasks.gpumode`) carry each
problem's own input generation and correctness check this way. Both are trusted task code, run in the judge's
process as the reference is (`ksearch.tasks.reference`); the candidate never sees them.

- ``generate(seed, **axes)`` returns every input of the definition by name: a torch tensor or NumPy array of the
  input's concrete shape and dtype, or a Python number for a scalar input. Its arrays are stored as
  `ksearch.tasks.inputs.make_inputs` stores drawn ones (C-contiguous NumPy, bfloat16 as uint16 bits).
- ``check(inputs, outputs)`` gets the inputs and the candidate's outputs by name (torch tensors on the CPU for a
  torch reference, else NumPy arrays in their storage dtype) and returns True/False, ``(ok, message)``, or a message
  (the empty string or None: passed), as GPU MODE's ``check_implementation`` does.
"""

from __future__ import annotations

import numpy as np

from ksearch.errors import TaskError
from ksearch.tasks.definition import Definition, Workload
from ksearch.tasks.guard import task_code
from ksearch.tasks.inputs import numpy_dtype, to_float64

_NAMESPACES: dict[str, dict] = {}


def _entry(definition: Definition, source: str, func: str, what: str):
    """The function ``func`` of a task source, compiled once per source text. Raises TaskError when the source
    does not load or defines no such function."""
    if source not in _NAMESPACES:
        namespace: dict = {"__name__": f"ksearch_{what.replace(' ', '_')}"}
        with task_code(f"the {what} of {definition.name!r} does not load:"):
            exec(compile(source, f"<{what} of {definition.name}>", "exec"), namespace)  # noqa: S102 - trusted task code
        _NAMESPACES[source] = namespace
    fn = _NAMESPACES[source].get(func)
    if not callable(fn):
        raise TaskError(f"the {what} of {definition.name!r} defines no function `{func}`")
    return fn


def to_storage(value, dtype: str, what: str) -> np.ndarray:
    """A torch tensor (any device) or array-like as a C-contiguous NumPy array in the storage dtype of ``dtype``
    (bfloat16 as its uint16 bits). Raises TaskError when its dtype is not ``dtype`` (no silent conversion)."""
    if hasattr(value, "detach"):  # a torch tensor
        t = value.detach().cpu().contiguous()
        if str(t.dtype) == "torch.bfloat16":
            import torch

            arr = t.view(torch.int16).numpy().view(np.uint16)
            got = "bfloat16"
        else:
            arr = t.numpy()
            got = str(t.dtype).removeprefix("torch.")
    else:
        arr = np.asarray(value)
        got = arr.dtype.name
    if got != dtype and not (dtype == "bfloat16" and arr.dtype == np.uint16):
        raise TaskError(f"{what} is {got}, the task says {dtype}")
    arr = np.asarray(arr, numpy_dtype(dtype))  # not ascontiguousarray: it makes a 0-d array 1-d
    return arr if arr.flags.c_contiguous else arr.copy(order="C")


def generate_inputs(definition: Definition, workload: Workload, seed: int) -> dict[str, np.ndarray | float | int]:
    """The inputs of one (workload, seed) from the definition's ``input_generator``, in definition order.

    Returns:
        name -> C-contiguous array of the input's concrete shape (axes substituted) in its storage dtype, or a
        Python number for a scalar input.

    Raises:
        TaskError: the generator fails, returns something other than a dict, misses or adds an input, or gives an
            input of another shape or dtype than the definition's.
    """
    axes = definition.axis_values(workload)
    generate = _entry(definition, definition.input_generator or "", "generate", "input generator")
    with task_code(f"the input generator of {definition.name!r} failed on workload {workload.label!r}:"):
        values = generate(seed, **axes)
    if not isinstance(values, dict):
        raise TaskError(f"the input generator of {definition.name!r} returned {type(values).__name__}, not a dict "
                        "of inputs by name")
    if set(values) != set(definition.inputs):
        raise TaskError(f"the input generator of {definition.name!r} returned inputs {sorted(values)}; the "
                        f"definition has {sorted(definition.inputs)}")
    out: dict[str, np.ndarray | float | int] = {}
    for name, spec in definition.inputs.items():
        value = values[name]
        shape = definition.shape_of(spec, axes)
        if shape is None:
            out[name] = value.item() if hasattr(value, "item") else value
            continue
        arr = to_storage(value, spec.dtype, f"input {name!r} of workload {workload.label!r}")
        if arr.shape != tuple(shape):
            raise TaskError(f"input {name!r} of workload {workload.label!r} has shape {arr.shape}; the definition "
                            f"says {tuple(shape)} ({spec.shape})")
        out[name] = arr
    return out


def _torch_of(value: np.ndarray, dtype: str):
    import torch

    if dtype == "bfloat16":
        return torch.from_numpy(to_float64(value, dtype)).to(torch.bfloat16)
    return torch.from_numpy(np.array(value, copy=True))


def run_checker(definition: Definition, inputs: dict, outputs: dict[str, np.ndarray]) -> tuple[bool, str]:
    """The task's own verdict on a candidate's outputs (``checker``): (passed, message). A check that raises
    fails the candidate with the exception as its message (a wrong output may well make a check raise).

    Args:
        inputs: the call's inputs as `generate_inputs` made them.
        outputs: the candidate's outputs by name, in their storage dtypes and shapes.

    Raises:
        TaskError: the checker source does not load, or the torch it needs is missing.
    """
    check = _entry(definition, definition.checker or "", "check", "checker")
    specs = {**definition.inputs, **definition.outputs}
    if definition.reference_backend == "torch":
        try:
            import torch  # noqa: F401
        except ImportError:
            raise TaskError(f"the check of {definition.name!r} uses PyTorch; install it with "
                            "`pip install torch==2.13.0` (CPU build)") from None
        conv = {k: (_torch_of(v, specs[k].dtype) if isinstance(v, np.ndarray) else v)
                for k, v in {**inputs, **outputs}.items()}
    else:
        conv = {k: (np.array(v, copy=True) if isinstance(v, np.ndarray) else v) for k, v in {**inputs, **outputs}.items()}
    try:  # a check that raises fails the candidate (a wrong output may well make it raise), not the task
        with task_code("the task's check raised"):
            result = check({k: conv[k] for k in inputs}, {k: conv[k] for k in outputs})
    except TaskError as e:
        return False, str(e)
    return verdict(result)


def verdict(result) -> tuple[bool, str]:
    """A check's return value as (passed, message): True/False, ``(ok, message)``, a message (empty or None:
    passed; GPU MODE's older checks return the reasons of a mismatch as a string) or a list of reasons (empty:
    passed). Raises TaskError for anything else: a value whose truth could mean either (a list of numbers, a
    tensor) must not decide a verdict."""
    if isinstance(result, (bool, np.bool_)):
        return bool(result), "" if result else "the task's check returned False"
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], (bool, np.bool_)):
        return bool(result[0]), "" if result[0] else str(result[1])
    if result is None or isinstance(result, str):
        return not result, result or ""
    if isinstance(result, (list, tuple)) and all(isinstance(x, str) for x in result):
        return not result, "; ".join(result)
    raise TaskError(f"the task's check returned {type(result).__name__} {str(result)[:80]!r}; a check returns "
                    "True/False, (ok, message), a message or a list of reasons (empty: passed)")
