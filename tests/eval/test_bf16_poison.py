"""bfloat16 outputs are poisoned with NaN bits (0xFFFF), not the integer pattern 0xA5A5: read as bfloat16 that
pattern is -2.9e-16, a finite value that passes wherever the reference is near zero, so a kernel that never
writes its output would pass there. The judge (cpu target) on a tiny bfloat16 task whose answer is zeros."""

from __future__ import annotations

import json

import numpy as np
from typer.testing import CliRunner

from ksearch.cli import app
from ksearch.tasks.inputs import poison_byte

DEFINITION = """
name: bf16-zeros
op_type: custom
description: y = 0 * x, in bfloat16 (a task whose answer is exactly zero)
axes:
  n: {type: var, min: 1, max: 4096}
inputs:
  x: {shape: [n], dtype: bfloat16}
outputs:
  y: {shape: [n], dtype: bfloat16}
reference_backend: numpy
reference: |
  import numpy as np


  def run(x):
      return np.zeros(np.shape(x))
"""

WRITES_NOTHING = "#include <stdint.h>\nvoid run(const uint16_t *x, uint16_t *y, int64_t n) { (void)x; (void)y; (void)n; }\n"
WRITES_ZEROS = ("#include <stdint.h>\nvoid run(const uint16_t *x, uint16_t *y, int64_t n) {\n"
                "    for (int64_t i = 0; i < n; i++) y[i] = 0;\n}\n")


def test_poison_byte_is_nan_for_floats_and_bfloat16_storage():
    assert poison_byte(np.float32) == poison_byte(np.float16) == poison_byte(np.uint16) == 0xFF
    assert np.isnan(np.frombuffer(bytes([0xFF, 0xFF]), np.float16)[0])
    bits = np.frombuffer(bytes([0xFF, 0xFF]), np.uint16).astype(np.uint32) << 16  # bfloat16 -> float32 bits
    assert np.isnan(bits.view(np.float32)[0])
    assert poison_byte(np.int32) == poison_byte(np.uint8) == 0xA5


def test_a_kernel_that_never_writes_its_bfloat16_output_fails(tmp_path, monkeypatch):
    monkeypatch.setenv("KSEARCH_HOME", str(tmp_path / "home"))
    task = tmp_path / "bf16-zeros"
    task.mkdir()
    (task / "definition.yaml").write_text(DEFINITION)
    (task / "workloads.jsonl").write_text(json.dumps({"axes": {"n": 300}, "name": "n300"}) + "\n")
    results = {}
    for name, src in (("nothing", WRITES_NOTHING), ("zeros", WRITES_ZEROS)):
        k = tmp_path / f"{name}.c"
        k.write_text(src)
        r = CliRunner().invoke(app, ["eval", str(task), str(k), "--target", "cpu", "--no-naive", "--json"])
        results[name] = r
    assert results["zeros"].exit_code == 0, results["zeros"].output
    assert results["nothing"].exit_code == 1, results["nothing"].output
    assert "INCORRECT" in results["nothing"].output
