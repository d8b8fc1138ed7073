"""bench/gpu/attention_h200.py off the GPU: its pure roofline/comparison helpers, the --dry-run plan (no torch
needed) and the CPU smoke mode end to end (SDPA MATH + the NumPy reference on tiny shapes, JSON + Markdown
written, the bf16 tasks included), the last ones skipped where torch is missing (CI)."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu" / "attention_h200.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("attention_h200", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod           # its dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop(spec.name, None)


def test_floor_takes_the_slower_of_memory_and_compute(bench):
    fl = bench.floor_ms(flops=2e12, nbytes=1e9, copy_bytes_per_s=4e12, peak_flops=1e15)
    assert fl["memory_ms"] == pytest.approx(0.25) and fl["compute_ms"] == pytest.approx(2.0)
    assert fl["floor_ms"] == pytest.approx(2.0) and fl["bound"] == "compute"
    mem_only = bench.floor_ms(flops=2e12, nbytes=1e9, copy_bytes_per_s=4e12, peak_flops=None)
    assert mem_only["floor_ms"] == pytest.approx(0.25) and mem_only["bound"] == "memory"


def test_row_metrics_units(bench):
    fl = bench.floor_ms(1e12, 4e9, 4e12, 1e15)          # floor 1 ms (memory)
    r = bench.row_metrics(2.0, 1e12, 4e9, fl, 4e12)
    assert r["tflops"] == pytest.approx(500.0)          # 1e12 FLOP in 2 ms
    assert r["gbs"] == pytest.approx(2000.0)            # 4 GB in 2 ms
    assert r["pct_floor"] == pytest.approx(50.0) and r["pct_copy_bw"] == pytest.approx(50.0)


def test_excess_passes_within_tolerance_and_fails_on_nan(bench):
    np = pytest.importorskip("numpy")
    ref = np.array([1.0, -2.0])
    assert bench.excess(ref + 0.001, ref, rtol=5e-3, atol=2e-3) < 0
    assert bench.excess(ref + 0.1, ref, rtol=5e-3, atol=2e-3) > 0
    assert bench.excess(np.array([np.nan, 0.0]), ref, rtol=1.0, atol=1.0) == math.inf


def _row(ms, group, dtype):
    return {"ms": ms, "group": group, "dtype": dtype, "pct_copy_bw": 0.0}


def test_compare_and_verdicts_against_cudnn(bench):
    rows = {"sdpa-cudnn fp16": _row(1.0, "baseline", "fp16"), "sdpa-flash fp16": _row(0.8, "baseline", "fp16"),
            "sdpa-cudnn bf16": _row(0.9, "baseline", "bf16"), "naive cuda": _row(10.0, "ksearch", "fp16"),
            "searched n1 cuda (run)": _row(1.5, "ksearch", "fp16")}
    cmp = bench.compare(rows, ["fp16", "bf16"])
    assert cmp["_refs"]["best baseline fp16"] == "sdpa-flash fp16"
    assert cmp["searched n1 cuda (run)"]["cuDNN fp16"] == pytest.approx(1.0 / 1.5)
    axes = {"head_dim": 128, "seqlen": 4096}
    v = bench.verdicts({"attention-prefill": {"w": {"axes": axes, "rows": rows}}}, {})
    # an fp16 kernel against fp16 cuDNN (its own dtype), not the bf16 one beside it
    assert len(v) == 1 and v[0]["kernel"] == "searched n1 cuda (run)" and v[0]["metric"] == "x vs sdpa-cudnn fp16"
    assert v[0]["value"] == pytest.approx(1.0 / 1.5) and v[0]["passed"]
    bf = {"sdpa-cudnn bf16": _row(0.9, "baseline", "bf16"), "searched n7 triton (r)": _row(1.8, "ksearch", "bf16"),
          "naive triton": _row(9.0, "ksearch", "bf16")}
    v = bench.verdicts({"attention-prefill-bf16": {"w": {"axes": axes, "rows": bf}}}, {})
    assert v[0]["metric"] == "x vs sdpa-cudnn bf16" and v[0]["value"] == pytest.approx(0.5) and not v[0]["passed"]
    only_fp16 = {"sdpa-cudnn fp16": _row(1.2, "baseline", "fp16"), "naive triton": _row(1.0, "ksearch", "bf16")}
    v = bench.verdicts({"attention-prefill-bf16": {"w": {"axes": axes, "rows": only_fp16}}}, {})
    assert v[0]["metric"] == "x vs sdpa-cudnn fp16 (the kernel is bf16)" and "no searched kernel" in v[0]["kernel"]
    dec = {"searched n2 triton (r)": {**_row(1.0, "ksearch", "fp16"), "pct_copy_bw": 65.0}}
    v = bench.verdicts({"attention-decode": {"w": {"axes": {}, "rows": dec}}}, {})
    assert v[0]["passed"] is False and v[0]["goal"] == 70.0


def test_parse_candidate_task_from_prefix_or_run_folder(bench, tmp_path):
    run = tmp_path / "attention-prefill-noncausal-20261130-010203-ab12" / "best"
    run.mkdir(parents=True)
    (run / "candidate.json").write_text("{}")
    assert bench.parse_candidate(str(run / "candidate.json"))[0] == "attention-prefill-noncausal"
    assert bench.parse_candidate(f"attention-decode:{run / 'candidate.json'}")[0] == "attention-decode"
    bf = tmp_path / "attention-prefill-bf16-20261130-010203-cd34" / "best"
    bf.mkdir(parents=True)
    (bf / "candidate.json").write_text("{}")
    assert bench.parse_candidate(str(bf / "candidate.json"))[0] == "attention-prefill-bf16"
    other = tmp_path / "x.json"
    other.write_text("{}")
    with pytest.raises(ValueError, match="TASK:PATH"):
        bench.parse_candidate(str(other))


def test_bf16_inputs_reach_torch_as_their_values_and_come_back_as_their_bits(bench):
    """make_inputs holds bfloat16 as uint16 bits: to_device reinterprets them (a plain .to(bfloat16) would convert
    the integers), to_storage gives the bits back; the reference of a bf16 task runs on the values."""
    torch = pytest.importorskip("torch", reason="torch not installed")
    np = pytest.importorskip("numpy")
    from ksearch.tasks import load_task
    from ksearch.tasks.inputs import make_inputs, to_float64
    from ksearch.tasks.reference import run_reference

    task = load_task("attention-prefill-bf16")
    arrs = make_inputs(task.definition, task.workload("mha-odd"), seed=0)
    q, k, v = bench.to_device(arrs, "cpu", "bf16", "bf16")
    assert q.dtype == torch.bfloat16 and np.array_equal(q.double().numpy(), to_float64(arrs["q"], "bfloat16"))
    assert np.array_equal(bench.to_storage(q, "bf16"), arrs["q"])
    assert bench.to_device(arrs, "cpu", "fp16", "bf16")[0].dtype == torch.float16
    want = run_reference(task.definition, arrs)["o"]
    values = {n: t.double().numpy() for n, t in zip("qkv", (q, k, v))}
    assert np.array_equal(bench.reference_on(task.definition, values), want)
    assert bench.task_dtype(task.definition) == "bf16"
    assert bench.task_dtype(load_task("attention-prefill").definition) == "fp16"


def _run(*args, timeout=120):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


def test_dry_run_prints_the_plan_and_exits_0():
    p = _run("--dry-run", "--tasks", "attention-prefill,attention-decode", "--dtype", "fp16,bf16")
    assert p.returncode == 0, p.stderr
    for text in ("llama3-8b-L4k", "llama3-8b-b32-kv4k", "sdpa-cudnn bf16", "flex fp16", "mlx fp16", "naive cuda"):
        assert text in p.stdout
    p = _run("--dry-run", "--tasks", "attention-prefill-bf16,attention-prefill-noncausal-bf16")
    assert p.returncode == 0, p.stderr
    assert "attention-prefill-noncausal-bf16 (bf16 kernels)" in p.stdout and "sdpa-cudnn bf16" in p.stdout
    assert "sdpa-cudnn fp16" not in p.stdout   # baselines default to the task's dtype
    assert any(line.split()[1:4] == ["naive", "cuda", "bf16"] for line in p.stdout.splitlines() if "naive cuda" in line)


def test_bad_dtype_is_a_user_error():
    p = _run("--dry-run", "--dtype", "fp8")
    assert p.returncode == 2 and "--dtype" in p.stderr


def test_cpu_smoke_mode_writes_json_and_markdown(tmp_path):
    pytest.importorskip("torch", reason="the CPU smoke mode runs torch SDPA (CI has no torch)")
    p = _run("--device", "cpu", "--tiny", "--dtype", "fp16,bf16", "--out", str(tmp_path))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    (js,) = tmp_path.glob("attention_cpu_*.json")
    assert (tmp_path / (js.stem + ".md")).is_file()
    report = json.loads(js.read_text())
    assert report["dtypes"] == ["fp16", "bf16"] and report["ceilings"]["copy_bytes_per_s"] > 0
    for task in ("attention-prefill", "attention-prefill-noncausal", "attention-decode", "attention-prefill-bf16",
                 "attention-prefill-noncausal-bf16"):
        st = report["status"][task]
        assert st["sdpa-math fp16"]["status"] == "passed" and st["sdpa-math bf16"]["status"] == "passed"
        assert st["sdpa-cudnn fp16"]["status"] == "unavailable"
        (w,) = report["results"][task].values()
        assert {"sdpa-math fp16", "sdpa-math bf16", "numpy reference (float64)"} <= set(w["rows"])
        assert all(r["ms"] > 0 and r["gbs"] > 0 for r in w["rows"].values())
        bf16_task = task.endswith("-bf16")
        assert w["dtype"] == ("bf16" if bf16_task else "fp16")
        assert w["rows"]["numpy reference (float64)"]["dtype"] == w["dtype"]
        if bf16_task:   # SDPA MATH in bf16 (fp32 inside) meets the bf16 task's own tolerance
            assert st["sdpa-math bf16"]["worst_excess_at_task_tolerance"] <= 0
    assert "x vs best baseline fp16" in report["markdown"]
    assert "Baselines at attention-prefill-bf16's own tolerance" in report["markdown"]


def test_profile_takes_the_flush_off_a_kernel_it_shares_with_the_candidate(bench, monkeypatch):
    """bench/gpu/attention_profile.py: the L2 flush is a float fill, and a candidate zeroing float scratch launches
    the same kernel; per call the flush's share is subtracted, not the whole kernel dropped."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import attention_profile as prof
    finally:
        sys.path.remove(str(SCRIPT.parent))
    fill, split = "FillFunctor<float>", "decode_split<128, 4, 4, 2, 8>"
    reps = 10   # per call: the flush's fill 6 us, the candidate's own fill 1 us, its split 25 us
    monkeypatch.setattr(prof, "_profile", lambda fn, n: {fill: (n * 7.0, 2 * n), split: (n * 25.0, n)})
    got = prof.kernel_times(lambda: None, lambda: None, reps, {fill: (6.0, 1)})
    assert got[fill] == {"us": pytest.approx(1.0), "launches": pytest.approx(1.0)}
    assert got[split] == {"us": pytest.approx(25.0), "launches": pytest.approx(1.0)}
    alone = prof.kernel_times(lambda: None, lambda: None, reps, {fill: (7.0, 2)})   # only the flush fills
    assert set(alone) == {split}
