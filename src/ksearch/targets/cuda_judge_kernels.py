"""The judge's own device work in a GPU worker, without CuPy's JIT kernels.

CuPy compiles an elementwise or reduction kernel with NVRTC the first time a process uses it (per dtype, and
for reductions per launch configuration), and GPU workers keep CuPy's kernel cache private (a hostile
candidate must not be able to overwrite a binary another worker loads; `ksearch.targets.cuda`). So every
worker paid those compiles again: the poisoning fill and the summaries of the timed outputs (astype,
isfinite, count_nonzero, where, abs, sum). Here they are memsets plus one small module of our own kernels,
compiled once per worker (one NVRTC call). Measured on the H200 (2026-11-30): `ksearch run selective-scan-fp16
--target cuda --budget 40` took 5.0 s per evaluation with this (bench/results/gpu-selective-scan-search-h200-
20261130.md) against ~9-10 s the day before without it, though the earlier run shared the CPUs with a build.

All calls run on CuPy's current stream; results that come back to the host synchronize it.
"""

from __future__ import annotations

from typing import Any

_SOURCE = r"""
#include <cuda_fp16.h>
__device__ __forceinline__ double as_double(float x) { return (double)x; }
__device__ __forceinline__ double as_double(double x) { return x; }
__device__ __forceinline__ double as_double(__half x) { return (double)__half2float(x); }

// acc[0] += number of non-finite elements, acc[1] += sum of |x| over the finite ones (as doubles)
template <typename T>
__device__ void summary(const T *__restrict__ x, long long n, unsigned long long *cnt, double *acc) {
    unsigned long long bad = 0;
    double total = 0.0;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const double v = as_double(x[i]);
        if (isfinite(v)) total += fabs(v); else ++bad;
    }
    for (int off = 16; off > 0; off >>= 1) {
        bad += __shfl_down_sync(0xffffffffu, bad, off);
        total += __shfl_down_sync(0xffffffffu, total, off);
    }
    if ((threadIdx.x & 31) == 0) {
        if (bad) atomicAdd(cnt, bad);
        atomicAdd(acc, total);
    }
}
extern "C" __global__ void ks_summary_f16(const __half *x, long long n, unsigned long long *cnt, double *acc) { summary(x, n, cnt, acc); }
extern "C" __global__ void ks_summary_f32(const float *x, long long n, unsigned long long *cnt, double *acc) { summary(x, n, cnt, acc); }
// one thread spins until `ns` nanoseconds of the global timer have passed (the timing loop's launch cover)
extern "C" __global__ void ks_spin(long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while ((long long)(t - t0) < ns);
}
extern "C" __global__ void ks_summary_f64(const double *x, long long n, unsigned long long *cnt, double *acc) { summary(x, n, cnt, acc); }
"""

_SUMMARY = {"float16": "ks_summary_f16", "float32": "ks_summary_f32", "float64": "ks_summary_f64"}
_THREADS = 256


class JudgeKernels:
    """Poisoning and output summaries for one worker's device (CuPy arrays)."""

    def __init__(self, cp: Any):
        self.cp = cp
        self._module = None
        self._scratch = None
        self._sms: int | None = None

    def _fn(self, name: str):
        if self._module is None:
            self._module = self.cp.RawModule(code=_SOURCE, options=("-std=c++17",))
        return self._module.get_function(name)

    def _grid(self, n: int) -> int:
        if self._sms is None:  # once: Device().attributes queries every attribute of the device
            self._sms = int(self.cp.cuda.Device().attributes["MultiProcessorCount"])
        return max(1, min(4 * self._sms, (n + _THREADS - 1) // _THREADS))

    def spin(self, us: float) -> None:
        """One thread on the current stream busy for ``us`` microseconds of the GPU's global timer."""
        import numpy as np

        self._fn("ks_spin")((1,), (1,), (np.int64(int(us * 1000)),))

    def fill_bytes(self, arr, byte: int) -> None:
        """Every byte of ``arr`` set to ``byte`` (0xFF makes float16/32/64 elements NaN)."""
        if arr.nbytes:
            arr.data.memset_async(int(byte) & 0xFF, arr.nbytes)

    def poison(self, arr) -> None:
        """Floats and bfloat16 storage (uint16) to NaN (all-ones bits), other dtypes to the byte 0xA5
        (`ksearch.tasks.inputs.poison_byte`)."""
        from ksearch.tasks.inputs import poison_byte

        self.fill_bytes(arr, poison_byte(arr.dtype))

    def summary(self, arrays) -> list[float]:
        """[non-finite element count, sum of |x| over the finite ones] over ``arrays`` (floats; other dtypes
        count their sum as float64 through CuPy, which no built-in task has)."""
        cp = self.cp
        if self._scratch is None:
            self._scratch = cp.zeros(2, cp.uint64)
        self._scratch.data.memset_async(0, self._scratch.nbytes)
        cnt = self._scratch[0:1]
        acc = self._scratch[1:2].view(cp.float64)
        extra = 0.0
        for arr in arrays:
            if arr.size == 0:
                continue
            name = _SUMMARY.get(arr.dtype.name)
            if name is None:
                extra += float(arr.astype(cp.float64).sum())
                continue
            x = cp.ascontiguousarray(arr)
            self._fn(name)((self._grid(x.size),), (_THREADS,), (x, cp.int64(x.size), cnt, acc))
        host = self._scratch.get()
        return [float(int(host[0])), float(host[1:2].view("float64")[0]) + extra]
