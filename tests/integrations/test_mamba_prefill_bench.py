"""bench/mlx/mamba_prefill.py end to end at toy sizes: it runs, checks, and writes its JSON and Markdown."""

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

pytestmark = pytest.mark.mlx

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "mlx" / "mamba_prefill.py"


def test_bench_runs_on_cpu_at_toy_sizes(tmp_path):
    spec = importlib.util.spec_from_file_location("mamba_prefill_bench", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rc = bench.main(["--layers", "1", "--Ls", "12,20", "--vocab", "64", "--decode", "2", "--reps", "1",
                     "--prefill-step", "16", "--stock-max-L", "12", "--out", str(tmp_path)])
    assert rc == 0
    (js,), (md,) = tmp_path.glob("*.json"), tmp_path.glob("*.md")
    rep = json.loads(js.read_text())
    assert [r["L"] for r in rep["rows"]] == [12, 20]
    first, second = rep["rows"]
    assert first["check"]["pass"] and first["check"]["prefill"]["top1_agreement"] == 1.0
    assert "stock" not in second and second["patched"]["prefill_tok_s"] > 0  # skipped above --stock-max-L
    assert second["patched"]["decode_steps"] == 2
    assert rep["scan"].startswith("reference_scan") and rep["versions"]["mlx-lm"] == "0.32.2"
    assert "not checked" in md.read_text() and "--stock-max-L 12" in rep["command"]
