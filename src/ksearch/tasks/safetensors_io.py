"""Read one tensor of a safetensors file as a task input (flashinfer-bench workloads name them).

The format (https://github.com/huggingface/safetensors, Apache-2.0): 8 bytes little-endian header length N, N bytes
of JSON (tensor name -> ``dtype``, ``shape``, ``data_offsets`` [begin, end) relative to the end of the header),
then the raw little-endian data. Read here directly, so that bfloat16 and float8 tensors (which NumPy lacks) come
back as their raw bits, the way ksearch stores those dtypes (`ksearch.tasks.inputs`).
"""

from __future__ import annotations

import json
import math
import os
import struct

import numpy as np

from ksearch.errors import TaskError

#: safetensors dtype -> the task dtypes it can hold
SAFETENSORS_DTYPES: dict[str, tuple[str, ...]] = {
    "F64": ("float64",), "F32": ("float32",), "F16": ("float16",), "BF16": ("bfloat16",),
    "F8_E4M3": ("float8_e4m3fn",), "F8_E5M2": ("float8_e5m2",),
    "I64": ("int64",), "I32": ("int32",), "I16": ("int16",), "I8": ("int8",), "U8": ("uint8",), "BOOL": ("bool",),
}


def read_tensor(path: str, key: str, dtype: str, shape: tuple[int, ...] | None, what: str) -> np.ndarray:
    """Tensor ``key`` of safetensors file ``path``, as a C-contiguous array of ``dtype``'s storage.

    Args:
        path: the file (absolute: the loader resolves relative paths).
        key: the tensor's name in the file.
        dtype: the task dtype the definition gives the input; the file's must be the same.
        shape: the input's concrete shape (None: a scalar, read as a 0-d array and returned as a number).
        what: the input's description for messages (``input 'kv_indptr' of workload 'batch_size=4'``).

    Raises:
        TaskError: the file cannot be read or is not safetensors, has no such key, or its dtype or shape is not
            the definition's.
    """
    from ksearch.tasks.inputs import numpy_dtype

    from ksearch.tasks.validate import open_regular

    try:
        f = open_regular(path, "safetensors file")  # a FIFO is refused, not waited on
    except TaskError as e:
        raise TaskError(f"{what}: {e}") from None
    try:
        with f:
            size = os.fstat(f.fileno()).st_size
            (n,) = struct.unpack("<Q", f.read(8))
            if n > 100 << 20:
                raise ValueError(f"header of {n} bytes")
            header = json.loads(f.read(n))
            meta = header.get(key)
            if not isinstance(meta, dict):
                keys = [k for k in header if k != "__metadata__"]
                raise TaskError(f"{what}: {path} has no tensor {key!r}; it has {keys[:20]}")
            if dtype not in SAFETENSORS_DTYPES.get(str(meta.get("dtype")), ()):
                raise TaskError(f"{what}: tensor {key!r} of {path} is {meta.get('dtype')}, the definition says "
                                f"{dtype}")
            begin, end = (int(x) for x in meta["data_offsets"])
            if not 0 <= begin <= end <= size - 8 - n:
                raise ValueError(f"tensor {key!r} at bytes {begin}..{end} of a {size - 8 - n}-byte data section")
            f.seek(8 + n + begin)
            raw = f.read(end - begin)
            got = tuple(int(x) for x in meta["shape"])
    except OSError as e:
        raise TaskError(f"{what}: cannot read safetensors file {path}: {e.strerror}") from None
    except (ValueError, KeyError, TypeError, struct.error, RecursionError) as e:
        raise TaskError(f"{what}: {path} is not a safetensors file ({type(e).__name__}: {e})") from None
    want = () if shape is None else tuple(shape)
    if got != want:
        raise TaskError(f"{what}: tensor {key!r} of {path} has shape {list(got)}, the workload's axes give "
                        f"{list(want)}")
    storage = numpy_dtype(dtype)
    if len(raw) != math.prod(got) * storage.itemsize:
        raise TaskError(f"{what}: tensor {key!r} of {path} holds {len(raw)} bytes, not {math.prod(got)} elements "
                        f"of {dtype}")
    arr = np.frombuffer(raw, storage.newbyteorder("<")).astype(storage).reshape(got)
    return arr.item() if shape is None else np.ascontiguousarray(arr)
