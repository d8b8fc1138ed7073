"""bench/mlx/mamba_prefill.py end to end at toy sizes: it runs stock, the vectorized MLX-ops baseline and a
scan module, checks their logits, and writes its JSON and Markdown."""

import importlib.util
import json
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

pytestmark = pytest.mark.mlx

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "mlx" / "mamba_prefill.py"

#: a stand-in for an exported kernel module (the task's 9 inputs, h0 last)
SCAN_MODULE = textwrap.dedent('''
    from ksearch.integrations.mlx_scan import reference_scan

    INPUTS = ["u", "delta", "A", "B", "C", "D", "z", "delta_bias", "h0"]

    def selective_scan(u, delta, A, B, C, D, z, delta_bias, h0):
        return reference_scan(u, delta, A, B, C, D, z, delta_bias, h0, chunk=4)
''')


def _bench():
    spec = importlib.util.spec_from_file_location("mamba_prefill_bench", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_bench_runs_on_cpu_at_toy_sizes(tmp_path):
    scan = tmp_path / "scan.py"
    scan.write_text(SCAN_MODULE)
    out = tmp_path / "out"
    rc = _bench().main(["--layers", "1", "--Ls", "12,20", "--vocab", "64", "--decode", "2", "--reps", "1",
                        "--prefill-step", "8", "--stock-max-L", "12", "--vec-chunk", "4", "--scan", str(scan),
                        "--out", str(out)])
    assert rc == 0
    (js,), (md,) = out.glob("*.json"), out.glob("*.md")
    rep = json.loads(js.read_text())
    assert [r["L"] for r in rep["rows"]] == [12, 20]
    first, second = rep["rows"]
    for v in ("vectorized", "patched"):  # prompts of 2 and 3 forwards: the cached state goes in as h0
        assert first["checks"][v]["against"] == "stock" and first["checks"][v]["pass"]
        assert first["checks"][v]["prefill"]["top1_agreement"] == 1.0
    assert set(first["speedups"]) == {"vectorized_vs_stock", "patched_vs_stock", "patched_vs_vectorized"}
    assert "stock" not in second and second["patched"]["prefill_tok_s"] > 0  # skipped above --stock-max-L
    assert second["checks"] == {"patched": {**second["checks"]["patched"], "against": "vectorized"}}
    assert second["checks"]["patched"]["pass"] and second["patched"]["decode_steps"] == 2
    assert rep["variants"]["vectorized"].startswith("reference_scan") and rep["versions"]["mlx-lm"] == "0.32.2"
    assert "patched vs vectorized pass" in md.read_text() and "--stock-max-L 12" in rep["command"]


def test_bench_without_a_scan_runs_stock_and_vectorized(tmp_path):
    rc = _bench().main(["--layers", "1", "--Ls", "12", "--vocab", "64", "--decode", "0", "--reps", "1",
                        "--prefill-step", "8", "--out", str(tmp_path)])
    assert rc == 0
    (row,) = json.loads(next(tmp_path.glob("*.json")).read_text())["rows"]
    assert "patched" not in row and row["checks"]["vectorized"]["pass"]


def test_bench_refuses_a_scan_module_without_h0(tmp_path):
    old = tmp_path / "old.py"
    old.write_text(SCAN_MODULE.replace(', "h0"]', "]"))
    with pytest.raises(ValueError, match="h0"):
        _bench().main(["--layers", "1", "--Ls", "12", "--scan", str(old), "--out", str(tmp_path)])
