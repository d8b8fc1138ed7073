"""The selective-scan triton pack: the rendered module's math under Triton's interpreter (TRITON_INTERPRET=1,
CPU torch tensors), against the task's float64 reference at odd sizes; skipped without torch and triton."""

import json
import os
import subprocess
import sys

import pytest

from ksearch.knowledge import load_pack
from ksearch.tasks import load_task

pytest.importorskip("torch", reason="torch not installed")
pytest.importorskip("triton", reason="triton not installed")

CHECK = r"""
import importlib.util, json, sys
import numpy as np, torch
spec = importlib.util.spec_from_file_location("kernel", sys.argv[1])
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
from ksearch.tasks import load_task
task = load_task(sys.argv[2]); half = "fp16" in sys.argv[2]
rng = np.random.default_rng(0)
bt, dim, N, L = 2, 5, 5, 75
u = rng.normal(size=(bt, dim, L)); delta = rng.normal(0, 0.5, (bt, dim, L)); A = -rng.uniform(1, 16, (dim, N))
B = rng.normal(size=(bt, N, L)); C = rng.normal(size=(bt, N, L)); D = rng.uniform(0.5, 1.5, dim)
z = rng.normal(size=(bt, dim, L)); db = rng.uniform(-4, -1, dim)
act = torch.float16 if half else torch.float32
ta = lambda x: torch.tensor(x, dtype=act); tf = lambda x: torch.tensor(x, dtype=torch.float32)
args = [ta(u), ta(delta), tf(A), ta(B), ta(C), tf(D), ta(z), tf(db)]
ns = {}; exec(task.definition.reference, ns)
ref_out, ref_h = ns["run"](*[a.double().numpy() for a in args])
out = torch.full((bt, dim, L), float("nan"), dtype=act); ls = torch.full((bt, dim, N), float("nan"))
mod.run(*args, out, ls)
tol = task.definition.tolerance["float16" if half else "float32"]
bad = lambda got, ref: float(np.max(np.abs(got - ref) - (tol.atol + tol.rtol * np.abs(ref))))
print(json.dumps({"out": bad(out.double().numpy(), ref_out), "last_state": bad(ls.double().numpy(), ref_h)}))
"""


@pytest.mark.parametrize("task_name", ["selective-scan", "selective-scan-fp16"])
def test_assoc_scan_module_matches_reference_in_interpreter(task_name, tmp_path):
    pack = load_pack(task_name, "triton")
    kernel = pack.render(load_task(task_name).definition, {}, {"block_d": 2, "block_l": 32, "num_warps": 2})
    path = tmp_path / "kernel.py"
    path.write_text(kernel.sources["kernel.py"])
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, "-c", CHECK, str(path), task_name], capture_output=True, text=True,
                       env=env, timeout=600)
    if r.returncode != 0 and "interpret" in r.stderr.lower():
        pytest.skip(f"Triton's interpreter does not run here: {r.stderr[-300:]}")
    assert r.returncode == 0, r.stderr[-3000:]
    excess = json.loads(r.stdout.strip().splitlines()[-1])
    assert excess["out"] <= 0 and excess["last_state"] <= 0, excess
