"""The dtypes a task may name (as flashinfer-bench spells them), their sizes, and the default tolerance per output
dtype."""

from __future__ import annotations

#: dtype name -> bytes per element. Names as flashinfer-bench spells them.
DTYPE_BYTES: dict[str, float] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "float4_e2m1": 0.5,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}

#: dtypes whose values are integers (random ones are drawn from an ``integers`` distribution)
INTEGER_DTYPES = frozenset({"int64", "int32", "int16", "int8", "uint8", "bool"})


def is_integer_dtype(dtype: str) -> bool:
    """Whether a task dtype holds integers (or booleans)."""
    return dtype in INTEGER_DTYPES


#: Default tolerances per output dtype, from mamba_ssm's selective-scan tests (fp32 rtol 6e-4 atol 2e-3,
#: fp16 rtol 3e-3 atol 5e-3, bf16 rtol 3e-2 atol 5e-2); integer outputs must match exactly.
DEFAULT_TOLERANCE: dict[str, dict[str, float]] = {
    "float64": {"rtol": 1e-6, "atol": 1e-8},
    "float32": {"rtol": 6e-4, "atol": 2e-3},
    "float16": {"rtol": 3e-3, "atol": 5e-3},
    "bfloat16": {"rtol": 3e-2, "atol": 5e-2},
}
