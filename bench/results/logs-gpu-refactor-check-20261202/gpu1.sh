#!/bin/bash
# Refactor check on the H200, call 1 of 2: the cuda/triton test files, the torch_sdpa baseline and each GPU
# target's hardware spec; the attention GPU packs (xdist) last, cut by SIGINT before the call's limit.
# Carries .device/wheels (pydantic & co., pyelftools) and .devmlx1 (MLX wheels, part 1 of mlx-cuda-13).
set -u
T0=$(date +%s); left() { echo $(( $1 - ($(date +%s) - T0) )); }
S=/tmp/mlxS; mkdir -p $S; cp .devmlx1/* $S/ &
python3 -m pip install -q --no-index --no-deps --target /tmp/kdeps .device/wheels/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD/src:/tmp/kdeps KSEARCH_BUSY_WAIT_S=0 PYTHONUNBUFFERED=1
LOG=$OUT/log1.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.used,utilization.gpu --format=csv; nvcc --version | tail -2
  python3 - <<'PY'
import platform, sys, importlib
print("python", sys.version.split()[0], platform.platform())
for m in ("numpy", "cupy", "torch", "triton", "pydantic", "typer", "pytest", "xdist"):
    try: print(m, importlib.import_module(m).__version__)
    except Exception as e: print(m, "MISSING", e)
import cupy, torch
p = cupy.cuda.runtime.getDeviceProperties(0)
print("gpu", p["name"].decode() if isinstance(p["name"], bytes) else p["name"], f"sm_{p['major']}{p['minor']}",
      "driver", cupy.cuda.runtime.driverGetVersion(), "runtime", cupy.cuda.runtime.runtimeGetVersion(),
      "torch.cuda", torch.version.cuda)
PY
} > $OUT/versions.txt 2>&1; cat $OUT/versions.txt
PT="python3 -m pytest -q -p no:cacheprovider -rfEs"
echo "== A: cuda/triton/nvrtc/exploits/ss-cuda/baselines" | tee $LOG
timeout -s INT 260 $PT --junitxml=$OUT/junit-a.xml tests/targets/test_cuda.py tests/targets/test_triton.py \
  tests/targets/test_nvrtc.py tests/eval/adversarial/test_cuda_exploits.py tests/knowledge/test_selective_scan_cuda.py \
  tests/eval/test_baselines.py >> $LOG 2>&1; echo "rc A $? at $(( $(date +%s) - T0 )) s" | tee -a $LOG
tail -40 $LOG
echo "== baseline torch_sdpa + hardware specs" | tee -a $LOG
KSEARCH_HOME=/tmp/kh timeout 120 python3 - > $OUT/baseline.txt 2>&1 <<'PY'
from ksearch.tasks import load_task
from ksearch.eval.baselines import time_baseline, load_baseline_module
from ksearch.targets.base import spec_for_target, get_target
for tg in ("cuda", "triton", "cpu"):
    t = get_target(tg)
    print(tg, "torch_device", t.torch_device, "gpu_devices", t.gpu_devices, "gpu_env", t.gpu_env)
    for task, wl in (("attention-prefill", "gqa-d128"), ("attention-decode", None)):
        T = load_task(task)
        w = wl or [x.name for x in T.workloads if x.purpose == "check"][0]
        try:
            ns = load_baseline_module(T, "torch-sdpa", tg)
            print(" ", task, w, "TORCH_DEVICE", ns["TORCH_DEVICE"], "TORCH_SPIN", ns["TORCH_SPIN"])
            r = time_baseline(T, "torch-sdpa", w, target=tg)
            print("   ", r.status.value, r.median_ms, r.message, "max_rel_err", r.max_rel_err)
        except Exception as e:
            print("   raised", type(e).__name__, e)
for tg in ("cuda", "triton"):
    s = spec_for_target(tg)
    print("spec", tg, s.model_dump_json()[:600])
PY
echo "rc baseline $?" >> $LOG; cat $OUT/baseline.txt
echo "== B: attention GPU packs (-n 6)" | tee -a $LOG
timeout -s INT $(left 545) $PT -n 6 --junitxml=$OUT/junit-b.xml tests/knowledge/test_attention_decode_gpu.py \
  tests/knowledge/test_attention_gpu.py >> $LOG 2>&1; echo "rc B $? at $(( $(date +%s) - T0 )) s" | tee -a $LOG
wait; ls -la $S | tee -a $LOG
grep -E "passed|failed|^FAILED|^ERROR" $LOG | tail -30
