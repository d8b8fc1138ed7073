"""The mlx-cuda target on an NVIDIA GPU through MLX's CUDA backend (marked ``mlx_cuda``; skipped elsewhere with
the reason). Run on the device machine: python -m pytest -q -m mlx_cuda tests/targets/test_mlx_gpu.py"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from ksearch.records import Candidate, Status
from ksearch.export import export_candidate
from ksearch.knowledge.pack import load_pack
from ksearch.tasks.loader import load_task

pytestmark = pytest.mark.mlx_cuda
TASKS = ("selective-scan", "selective-scan-fp16")


def _evaluate(task, candidate, workloads):
    from ksearch.eval.evaluator import EvalConfig, Evaluator
    from ksearch.jail.sandbox import Policy

    ev = Evaluator(task, "mlx-cuda", None, EvalConfig(seeds=[1, 2], sandbox=Policy(namespaces="off")))
    try:
        return ev.evaluate(candidate, workloads)
    finally:
        ev.close()


def naive(t) -> Candidate:
    return Candidate(target="mlx-cuda", sources={"kernel.cu": t.naive_sources["mlx-cuda"]},
                     launch=t.naive_launch["mlx-cuda"])


@pytest.mark.parametrize("name", TASKS)
def test_naive_kernel_passes(name):
    t = load_task(name)
    result = _evaluate(t, naive(t), ["tiny"])
    assert result.status is Status.PASSED, result.message
    assert result.workloads[0].median_ms > 0


@pytest.mark.parametrize("family, choices", [("warp-chunks", {"bc_tiles": "smem", "exp": "ex2-approx"}),
                                             ("block-scan", {}), ("warp-lanes", {})])
def test_pack_kernels_pass(family, choices):
    t = load_task("selective-scan-fp16")
    k = load_pack(t.definition.name, "mlx-cuda").render(t.definition, {"family": family, **choices})
    result = _evaluate(t, Candidate(target="mlx-cuda", sources=k.sources, launch=k.launch), ["tiny", "long-seq"])
    assert result.status is Status.PASSED, result.message


def test_compile_error_carries_mlx_message():
    t = load_task("selective-scan-fp16")
    cand = Candidate(target="mlx-cuda", sources={"kernel.cu": "out[0] = oops_undefined;"},
                     launch=t.naive_launch["mlx-cuda"])
    result = _evaluate(t, cand, ["tiny"])
    assert result.status is Status.COMPILE_ERROR and "oops_undefined" in result.message


def test_kernel_that_writes_nothing_fails():
    t = load_task("selective-scan-fp16")
    cand = Candidate(target="mlx-cuda", sources={"kernel.cu": "(void)u;"}, launch=t.naive_launch["mlx-cuda"])
    assert _evaluate(t, cand, ["tiny"]).status is Status.INCORRECT_NUMERICAL


def test_exported_module_matches_the_reference(tmp_path):
    import mlx.core as mx

    t = load_task("selective-scan-fp16")
    k = load_pack(t.definition.name, "mlx-cuda").render(t.definition, {"family": "warp-chunks", "bc_tiles": "smem"})
    path = export_candidate(Candidate(target="mlx-cuda", sources=k.sources, launch=k.launch), t.definition,
                            tmp_path / "scan.py", {})
    spec = importlib.util.spec_from_file_location("scan", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rng = np.random.default_rng(0)
    b, d, n, L = 2, 64, 16, 1000
    u, delta, z = (rng.standard_normal((b, d, L)).astype(np.float16) for _ in range(3))
    A = -rng.uniform(1, 16, (d, n)).astype(np.float32)
    B, C = (rng.standard_normal((b, n, L)).astype(np.float16) for _ in range(2))
    D, bias = rng.uniform(0.5, 1.5, d).astype(np.float32), rng.uniform(-4, -1, d).astype(np.float32)
    out, last = mod.selective_scan(*(mx.array(x) for x in (u, delta, A, B, C, D, z, bias)))
    ns = {}
    exec(t.definition.reference, ns)
    ref_out, ref_last = ns["run"](u, delta, A, B, C, D, z, bias)
    np.testing.assert_allclose(np.array(out).astype(np.float64), ref_out, rtol=3e-3, atol=5e-3)
    np.testing.assert_allclose(np.array(last), ref_last, rtol=1e-3, atol=1e-3)
