"""8-bit floats as NumPy holds them: raw uint8 bits, encoded and decoded through a table of the 256 values.

Formats as flashinfer-bench and PyTorch name them (OCP 8-bit floating point specification, 2023):

- ``float8_e4m3fn``: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities; NaN is S.1111.111; largest
  finite 448.
- ``float8_e5m2``: 1 sign, 5 exponent (bias 15), 2 mantissa bits; IEEE-like (infinities, NaNs); largest finite
  57344.

`encode` rounds to the nearest representable value (ties to the even code); beyond the largest finite value it
saturates (e4m3fn, which has no infinity) or gives infinity (e5m2), as PyTorch's ``.to()`` does; NaN encodes as
NaN.
"""

from __future__ import annotations

import numpy as np

#: format -> (exponent bits, mantissa bits, bias, has infinities)
FORMATS: dict[str, tuple[int, int, int, bool]] = {
    "float8_e4m3fn": (4, 3, 7, False),
    "float8_e5m2": (5, 2, 15, True),
}
_TABLES: dict[str, np.ndarray] = {}


def table(dtype: str) -> np.ndarray:
    """The float64 value of each of the 256 codes of a format (NaN where the code is a NaN)."""
    if dtype not in _TABLES:
        ebits, mbits, bias, has_inf = FORMATS[dtype]
        codes = np.arange(256)
        sign = np.where(codes & 0x80, -1.0, 1.0)
        exp = (codes >> mbits) & ((1 << ebits) - 1)
        man = codes & ((1 << mbits) - 1)
        normal = (1 + man / (1 << mbits)) * np.exp2(exp.astype(np.float64) - bias)
        sub = man / (1 << mbits) * 2.0 ** (1 - bias)
        vals = sign * np.where(exp == 0, sub, normal)
        top = exp == (1 << ebits) - 1
        if has_inf:
            vals = np.where(top & (man == 0), sign * np.inf, vals)
            vals = np.where(top & (man != 0), np.nan, vals)
        else:
            vals = np.where(top & (man == (1 << mbits) - 1), np.nan, vals)
        _TABLES[dtype] = vals
    return _TABLES[dtype]


def decode(bits: np.ndarray, dtype: str) -> np.ndarray:
    """float64 values of an array of codes (uint8) of a format."""
    return table(dtype)[np.asarray(bits, np.uint8)]


def encode(values: np.ndarray, dtype: str) -> np.ndarray:
    """uint8 codes of the nearest values of a format (module docstring), same shape as ``values``."""
    vals = table(dtype)
    pos_codes = np.arange(128)
    finite = np.isfinite(vals[:128])
    order = pos_codes[finite][np.argsort(vals[:128][finite], kind="stable")]
    grid = vals[order]  # ascending non-negative finite values, with their codes
    x = np.asarray(values, np.float64)
    mag = np.minimum(np.abs(x), grid[-1])
    hi = np.clip(np.searchsorted(grid, mag), 1, len(grid) - 1)
    lo = hi - 1
    d_lo, d_hi = mag - grid[lo], grid[hi] - mag
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (order[hi] % 2 == 0))
    codes = np.where(pick_hi, order[hi], order[lo]).astype(np.uint8)
    codes = np.where(np.signbit(x), codes | 0x80, codes)
    if FORMATS[dtype][3]:  # e5m2: past the largest finite value is infinity
        codes = np.where(np.abs(x) > grid[-1], np.where(x > 0, 0x7C, 0xFC), codes)
    return np.where(np.isnan(x), 0x7F, codes).astype(np.uint8)
