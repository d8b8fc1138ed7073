"""Make a workload's inputs: random by each input's distribution (the workload's ``distributions`` over the
definition's), or as the workload says.

Arrays are NumPy, C-contiguous, in the definition's dtype (bfloat16 held as its raw uint16 bits, float8_e4m3fn and
float8_e5m2 as their raw uint8 bits, since NumPy has none of them: `ksearch.tasks.fp8`). Scalars (shape None) are
Python numbers. Paged/ragged index inputs are drawn consistent with each other (`ksearch.tasks.structured`),
safetensors inputs read from their files (`ksearch.tasks.safetensors_io`), and constraints over input data checked
once the inputs exist.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ksearch.errors import TaskError
from ksearch.tasks import fp8
from ksearch.tasks.definition import (Definition, Distribution, RandomInput, SafetensorsInput, ScalarInput, Workload,
                                      is_integer_dtype)
from ksearch.tasks.safetensors_io import read_tensor
from ksearch.tasks.structured import check_data_constraints, fill_index_inputs, index_inputs

#: NumPy storage dtype for each task dtype (bfloat16 stored as uint16 bits, fp8 as uint8 bits; fp4 not supported).
NUMPY_DTYPES: dict[str, np.dtype] = {
    "float64": np.dtype(np.float64),
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(np.uint16),
    "int64": np.dtype(np.int64),
    "int32": np.dtype(np.int32),
    "int16": np.dtype(np.int16),
    "int8": np.dtype(np.int8),
    "uint8": np.dtype(np.uint8),
    "bool": np.dtype(np.bool_),
    "float8_e4m3fn": np.dtype(np.uint8),
    "float8_e5m2": np.dtype(np.uint8),
}


#: task dtypes NumPy holds as raw bits (decoded by `to_float64`)
BIT_STORED = frozenset({"bfloat16", "float8_e4m3fn", "float8_e5m2"})


def numpy_dtype(dtype: str) -> np.dtype:
    """Storage dtype for a task dtype. Raises TaskError for dtypes ksearch cannot hold yet (fp8, fp4)."""
    try:
        return NUMPY_DTYPES[dtype]
    except KeyError:
        raise TaskError(f"dtype {dtype!r} is not supported for inputs yet; supported: {sorted(NUMPY_DTYPES)}") from None


def poison_byte(storage: np.dtype) -> int:
    """The byte every output element is filled with before a kernel runs, so that an element it never writes
    cannot pass: 0xFF for floats and for uint16 (the storage of bfloat16: 0xFFFF is a bfloat16 NaN, as all-ones
    is a float16/32/64 NaN), 0xA5 for other integers (an unlikely value; integers have no NaN)."""
    dt = np.dtype(storage)
    return 0xFF if dt.kind == "f" or dt == np.dtype(np.uint16) else 0xA5


def bf16_from_f32(x: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 (round to nearest even), returned as uint16 bits."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)
    return (rounded >> 16).astype(np.uint16)


def to_float64(x: np.ndarray, dtype: str) -> np.ndarray:
    """Widen a stored array of a task dtype to float64 (decoding bfloat16 and float8 bits)."""
    if dtype == "bfloat16":
        return (x.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if dtype in fp8.FORMATS:
        return fp8.decode(x, dtype)
    return np.asarray(x, np.float64)


def _encode(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values in a task dtype's storage: bfloat16 and float8 bits, else a cast."""
    if dtype == "bfloat16":
        return bf16_from_f32(values)
    if dtype in fp8.FORMATS:
        return fp8.encode(values, dtype)
    return values


def _draw(rng: np.random.Generator, dist: Distribution, shape: tuple[int, ...]) -> np.ndarray:
    if dist.kind == "zeros":
        return np.zeros(shape, np.float32)
    if dist.kind == "normal":
        return dist.mean + dist.std * rng.standard_normal(shape, dtype=np.float32)
    if dist.kind == "uniform":
        return rng.uniform(dist.low, dist.high, shape).astype(np.float32)
    if dist.kind == "neg_uniform":
        return -rng.uniform(dist.low, dist.high, shape).astype(np.float32)
    return rng.integers(int(dist.low), int(dist.high), shape)


#: elements drawn and converted per step in `_fill` (cache-sized: no full-size float32 temporary)
_CHUNK = 1 << 18


def _fill(rng: np.random.Generator, dist: Distribution, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """An input array of ``shape`` in the storage dtype of ``dtype``, drawn from ``dist``: bit for bit what
    ``_draw`` over the whole shape then one conversion gives, but for normal and uniform draws made and
    converted in cache-sized steps into the final array (the stream is consumed one value at a time, so the
    values do not depend on the steps), which saves two full-size temporaries and their page faults."""
    storage = numpy_dtype(dtype)
    if dist.kind == "integers":
        values = _draw(rng, dist, shape)
        encoded = _encode(values.astype(np.float32), dtype) if storage.kind == "u" and dtype != "uint8" else values
        return np.ascontiguousarray(encoded, storage).reshape(shape)
    n = math.prod(shape)
    out = np.empty(n, storage)
    for start in range(0, n, _CHUNK):
        chunk = _draw(rng, dist, (min(_CHUNK, n - start),))
        out[start:start + chunk.size] = _encode(chunk, dtype)
    return out.reshape(shape)


def make_inputs(definition: Definition, workload: Workload, seed: int) -> dict[str, np.ndarray | float | int]:
    """Inputs for one call of a workload, deterministic in ``seed``. Arrays of independent streams are drawn
    in parallel threads (NumPy releases the GIL while it draws and converts); the values do not depend on it.

    Returns:
        name -> array of the input's concrete shape (axes substituted) and storage dtype, or a Python scalar.

    Raises:
        TaskError: a bad dtype, a workload whose arrays do not fit in this machine's memory
            (`ksearch.tasks.validate.check_fits_memory`), an input too large to allocate, a safetensors input whose
            file, key, dtype or shape does not fit, or a constraint over input data that the inputs break (`ksearch.tasks.structured`). A
            definition with an ``input_generator`` gets its inputs from it
            (`ksearch.tasks.generated.generate_inputs`, which raises for a failing one).
    """
    from ksearch.tasks.validate import check_fits_memory

    check_fits_memory(definition, workload, definition.axis_values(workload))  # before anything is allocated
    if definition.input_generator is not None:  # the task's own generator (imported KernelBench, GPU MODE problems)
        from ksearch.tasks.generated import generate_inputs

        return generate_inputs(definition, workload, seed)
    axes = definition.axis_values(workload)
    out: dict[str, np.ndarray | float | int] = {}
    arrays: list[tuple[str, np.random.Generator, Distribution, tuple[int, ...], str]] = []
    for index, (name, spec) in enumerate(definition.inputs.items()):
        how = workload.inputs.get(name, RandomInput(type="random"))
        shape = definition.shape_of(spec, axes)
        if isinstance(how, ScalarInput):
            out[name] = how.value
            continue
        if isinstance(how, SafetensorsInput):
            out[name] = read_tensor(how.path, how.tensor_key, spec.dtype, shape, f"input {name!r} of workload "
                                    f"{workload.label!r}")
            continue
        # one independent stream per (seed, input index): adding an input does not change the others
        rng = np.random.default_rng([seed, index])
        is_int = is_integer_dtype(spec.dtype)
        dist = workload.distributions.get(name) or spec.distribution or (Distribution(kind="integers", low=0, high=2 if spec.dtype == "bool" else 100)
                                     if is_int else Distribution())
        if shape is None:
            out[name] = _draw(rng, dist, ()).item()
            continue
        numpy_dtype(spec.dtype)  # an unsupported dtype is refused before anything is drawn
        out[name] = None  # keeps the definition's order
        arrays.append((name, rng, dist, tuple(shape), spec.dtype))

    def fill(item) -> np.ndarray:
        name, rng, dist, shape, dtype = item
        try:
            return _fill(rng, dist, shape, dtype)
        except MemoryError:
            raise TaskError(f"input {name!r} of workload {workload.label!r} ({shape}, {dtype}) does not fit "
                            "in memory") from None

    big = [a for a in arrays if math.prod(a[3]) >= 4 * _CHUNK]
    workers = min(len(big), os.cpu_count() or 1)
    if workers > 1:
        with ThreadPoolExecutor(workers) as pool:
            filled = dict(zip((a[0] for a in big), pool.map(fill, big)))
    else:
        filled = {}
    structured = index_inputs(definition)
    for item in arrays:
        if item[0] not in structured or item[0] in workload.distributions or definition.inputs[item[0]].distribution:
            out[item[0]] = filled[item[0]] if item[0] in filled else fill(item)
    fill_index_inputs(definition, axes, seed, workload.label, out)  # the index arrays still None
    check_data_constraints(definition, workload.label, axes, out)
    return out
