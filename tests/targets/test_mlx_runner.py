"""The mlx runner's call and timing logic without an MLX GPU: MLX's CPU backend with `mx.fast.cuda_kernel`
replaced by a fake that computes the selective scan with `reference_scan` (plain MLX ops) and records how it was
called. Checks what the judge relies on: check calls start outputs as NaN (`init_value`), timed calls do not
(the fill would be timed), a failure at a launch's first call is a COMPILE_ERROR, outputs reach the files."""

from __future__ import annotations

import numpy as np
import pytest

from ksearch.errors import KernelCompileError
from ksearch.protocol import ArgRef, ArrayRef, ScalarRef, TimingPlan
from ksearch.tasks import load_task

mx = pytest.importorskip("mlx.core")
FP16 = load_task("selective-scan-fp16")
B, D, N, L = 1, 8, 4, 40


@pytest.fixture
def fake_cuda(monkeypatch):
    from ksearch.integrations.mlx_scan import reference_scan

    calls, state = [], {"fail": False}

    def cuda_kernel(**spec):
        def kernel(inputs, **kw):
            calls.append(kw)
            if state["fail"]:
                raise RuntimeError("nvrtc: error: identifier 'oops' is undefined")
            out, last = reference_scan(*inputs)
            return [out.astype(kw["output_dtypes"][0]), last.astype(kw["output_dtypes"][1])]
        return kernel

    monkeypatch.setattr(mx.cuda, "is_available", lambda: True)
    monkeypatch.setattr(mx, "set_default_device", lambda d: None)
    monkeypatch.setattr(mx.fast, "cuda_kernel", cuda_kernel)
    return calls, state


def refs(tmp_path) -> tuple[list[ArgRef], dict]:
    rng = np.random.default_rng(0)
    d = FP16.definition
    axes = {"batch": B, "dim": D, "dstate": N, "seqlen": L}
    arrays = {"u": rng.standard_normal((B, D, L)), "delta": rng.standard_normal((B, D, L)) * 0.5,
              "A": -rng.uniform(1, 4, (D, N)), "B": rng.standard_normal((B, N, L)),
              "C": rng.standard_normal((B, N, L)), "D": rng.uniform(0.5, 1.5, D), "z": rng.standard_normal((B, D, L)),
              "delta_bias": rng.uniform(-4, -1, D), "h0": rng.standard_normal((B, D, N))}
    out: list[ArgRef] = []
    for name, spec in d.inputs.items():
        a = arrays[name].astype(spec.dtype)
        a.tofile(tmp_path / name)
        out.append(ArrayRef(path=str(tmp_path / name), dtype=a.dtype.str, shape=a.shape, writable=False))
    for name, spec in d.outputs.items():
        shape = d.shape_of(spec, axes)
        np.full(shape, 7, spec.dtype).tofile(tmp_path / name)
        out.append(ArrayRef(path=str(tmp_path / name), dtype=np.dtype(spec.dtype).str, shape=shape, writable=True))
    out += [ScalarRef(value=axes[a]) for a in d.axes]
    return out, arrays


def runner():
    from ksearch.targets.mlx_runtime import MlxRunner

    payload = {"target": "mlx-cuda", "header": "", "body": FP16.naive_sources["mlx-cuda"],
               "launch": FP16.naive_launch["mlx-cuda"], "kernel_name": "ksearch_test"}
    return MlxRunner(payload, FP16.definition)


def test_a_check_call_starts_outputs_as_nan_and_writes_them_back(fake_cuda, tmp_path):
    calls, _ = fake_cuda
    args, arrays = refs(tmp_path)
    runner().call(args)
    assert len(calls) == 1 and np.isnan(calls[0]["init_value"])
    assert calls[0]["grid"] == (B * D, 1, 1) and dict(calls[0]["template"])["seqlen"] == L
    out = np.fromfile(tmp_path / "out", np.float16).reshape(B, D, L)
    ns = {}
    exec(FP16.definition.reference, ns)
    want, _ = ns["run"](*(arrays[n] for n in FP16.definition.inputs))
    np.testing.assert_allclose(out, want, rtol=3e-3, atol=5e-3)


def test_timed_calls_pass_no_init_value_and_return_one_summary_each(fake_cuda, tmp_path):
    calls, _ = fake_cuda
    args, _ = refs(tmp_path)
    times, sums = runner().timed(args, None, TimingPlan(warmup=1, min_repeats=3, max_repeats=3, min_time_s=0,
                                                        flush_bytes=1 << 20))
    assert len(times) == len(sums) == 3 and all(t > 0 for t in times)
    assert all(s == sums[0] and s[0] == 0 for s in sums)  # no non-finite values, the same answer every time
    timed = calls[-3:]
    assert all("init_value" not in kw for kw in timed) and all("init_value" in kw for kw in calls[:-3])


def test_a_failure_at_a_launch_first_call_is_a_compile_error(fake_cuda, tmp_path):
    _, state = fake_cuda
    state["fail"] = True
    args, _ = refs(tmp_path)
    with pytest.raises(KernelCompileError, match="identifier 'oops'"):
        runner().call(args)
