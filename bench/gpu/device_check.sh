#!/usr/bin/env bash
# Device check of the cuda target, run once on the lent H200 from the repo root (under 5 minutes):
#   bash bench/gpu/device_check.sh
# Writes everything under $OUT (default ./device-check-out); the summary table is printed last.
# Steps: versions and which of ksearch's dependencies import; the GPU spec; pytest -m cuda; `ksearch eval` of
# the fp16 naive kernel through the jailed worker, then (only if that failed) with --namespaces off.
set -u
OUT=${OUT:-$PWD/device-check-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
export KSEARCH_HOME=${KSEARCH_HOME:-$(mktemp -d)/ksearch}
PY=${PYTHON:-python3}
summary=()
step() {  # step NAME TIMEOUT_S CMD...: run, keep its output in $OUT/NAME.log, remember its exit status
  local name=$1 limit=$2; shift 2
  echo "== $name: $*" | tee -a "$OUT/steps.txt"
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$OUT/$name.log"
  summary+=("$(printf '%-22s rc=%s' "$name" "$rc")")
  return $rc
}

step versions 60 $PY - <<'PY'
import importlib, platform, sys
print("python", sys.version.split()[0], platform.platform())
for mod in ("numpy", "torch", "triton", "cupy", "pydantic", "typer", "rich", "yaml", "jinja2", "pytest"):
    try:
        m = importlib.import_module(mod)
        print(f"{mod:10s} {getattr(m, '__version__', '?')}")
    except Exception as e:
        print(f"{mod:10s} MISSING ({type(e).__name__}: {e})")
try:
    import cupy
    p = cupy.cuda.runtime.getDeviceProperties(0)
    print("gpu", p["name"], f"sm_{p['major']}{p['minor']}", "driver", cupy.cuda.runtime.driverGetVersion(),
          "runtime", cupy.cuda.runtime.runtimeGetVersion())
except Exception as e:
    print("gpu: NOT AVAILABLE", e)
PY
grep -q MISSING "$OUT/versions.log" && echo "!! some dependencies are missing (see above): carry their wheels" | tee -a "$OUT/steps.txt"
ls -l /dev/nvidia* >"$OUT/dev-nodes.txt" 2>&1

step gpu_spec 120 $PY -m ksearch hardware show --gpu --json
cp "$OUT/gpu_spec.log" "$OUT/gpu_spec.json" 2>/dev/null
step pytest_cuda 180 $PY -m pytest -m cuda -q -p no:cacheprovider tests/targets/test_cuda.py -rs
EVAL=($PY -m ksearch eval selective-scan-fp16 src/ksearch/tasks/builtin/selective-scan-fp16/naive.cuda.cu
      --target cuda --json -w tiny,small-b2,mamba370m-L512)
if step eval_jailed 240 "${EVAL[@]}"; then
  summary+=("jailed path works: no fallback needed")
else
  echo "!! jailed eval failed; trying the documented fallback --namespaces off" | tee -a "$OUT/steps.txt"
  step eval_unjailed 240 "${EVAL[@]}" --namespaces off
fi
echo; echo "== summary (logs in $OUT)"; printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
