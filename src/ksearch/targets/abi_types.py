"""The dtype dialects of the targets' ABIs: one table per dialect, task dtype name -> the C-family type a kernel
declares its buffers with. A target answers its table (`Target.ctypes`: one of these, shared by the targets that
speak the dialect, or a new target's own); prompts, knowledge packs and translation units take the types from
there, never from a copy.

- ``c``: the cpu target's ABI (ctypes pointers; C has no portable bfloat16: its uint16_t bits; float16 as GCC's
  and Clang's ``_Float16``; bool as one byte; float8 formats as their uint8_t bits);
- ``cuda``: the cuda target's ABI (docs/cuda-target.md: ``long long`` axes and int64, ``__half`` from
  cuda_fp16.h, ``__nv_bfloat16`` from cuda_bf16.h, ``__nv_fp8_e4m3``/``__nv_fp8_e5m2`` from cuda_fp8.h);
- ``mlx-cuda``: the types MLX's CUDA backend declares a custom kernel's buffers with (mlx 0.32:
  backend/cuda/utils.cpp, ``dtype_to_cuda_type``);
- ``metal``: the types MLX's Metal backend declares them with (the ``float16_t`` / ``bfloat16_t`` typedefs of
  MLX's Metal utilities; ``int`` is 32 bits in the Metal Shading Language).
"""

from __future__ import annotations

from collections.abc import Mapping

C_TYPES: dict[str, str] = {"float32": "float", "float64": "double", "float16": "_Float16", "bfloat16": "uint16_t",
                           "int64": "int64_t", "int32": "int32_t", "int16": "int16_t", "int8": "int8_t",
                           "uint8": "uint8_t", "bool": "uint8_t", "float8_e4m3fn": "uint8_t", "float8_e5m2": "uint8_t"}
CUDA_TYPES: dict[str, str] = {"float32": "float", "float64": "double", "float16": "__half",
                              "bfloat16": "__nv_bfloat16", "int64": "long long", "int32": "int", "int16": "short",
                              "int8": "signed char", "uint8": "unsigned char", "bool": "unsigned char",
                              "float8_e4m3fn": "__nv_fp8_e4m3", "float8_e5m2": "__nv_fp8_e5m2"}
MLX_CUDA_TYPES: dict[str, str] = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16",
                                  "float64": "double", "int32": "int32_t", "int64": "int64_t", "int16": "int16_t",
                                  "int8": "int8_t", "uint8": "uint8_t", "uint32": "uint32_t", "bool": "bool"}
METAL_TYPES: dict[str, str] = {"float32": "float", "float16": "float16_t", "bfloat16": "bfloat16_t", "int32": "int",
                               "int64": "int64_t"}

def c_type(ctypes: Mapping[str, str], dtype: str) -> str:
    """The type of one element of ``dtype`` in the dialect of table ``ctypes`` (the dtype's own name where the table
    has none, as a prompt shows an unsupported dtype)."""
    return ctypes.get(dtype, dtype)


def c_params(definition, ctypes: Mapping[str, str], axis_type: str) -> list[str]:
    """The parameters of a C-family entry point taking ``definition``'s arguments in ABI order: an input array
    as ``const T *name``, a scalar input as ``double`` (float dtypes) or ``axis_type`` (ints, bools), an output
    as ``T *name``, then every axis as ``axis_type`` (``T`` from the table ``ctypes``). ``definition``: a
    `ksearch.tasks.definition.Definition`."""
    params = []
    for name, spec in definition.inputs.items():
        if spec.shape is None:
            params.append(f"{'double' if spec.dtype.startswith('float') else axis_type} {name}")
        else:
            params.append(f"const {c_type(ctypes, spec.dtype)} *{name}")
    params += [f"{c_type(ctypes, s.dtype)} *{n}" for n, s in definition.outputs.items()]
    params += [f"{axis_type} {a}" for a in definition.axes]
    return params
