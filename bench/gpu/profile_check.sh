#!/bin/bash
# Issue 20 (profiler evidence) on the H200, call 1 of 2: which metrics and sections the installed ncu has; cuda
# candidates judged with profiling on, each raw ncu report kept (bench/gpu/profile_capture.py); the profiling tests;
# then tests/targets/test_cuda.py and tests/targets/test_triton.py. Carries .device (pydantic & co. as wheels) and
# .devmlx1 (MLX part 1 of mlx-cuda-13, copied to $S for call 2: bench/gpu/profile_check_mlx.sh).
set -u
REAL_OUT=$OUT; OUT=/tmp/o1; mkdir -p $OUT  # $OUT brings back 8 files at most: all of it as one tarball
T0=$(date +%s); left() { echo $(( $1 - ($(date +%s) - T0) )); }
S=/tmp/mlxS; mkdir -p $S; cp .devmlx1/* $S/ &
python3 -m pip install -q --no-index --no-deps --target /tmp/kdeps .device/wheels/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD/src:/tmp/kdeps:$PWD KSEARCH_BUSY_WAIT_S=0 PYTHONUNBUFFERED=1 KSEARCH_HOME=/tmp/kh
LOG=$OUT/log1.txt
{ date -u; uname -r; nvidia-smi --query-gpu=name,driver_version,memory.used,utilization.gpu --format=csv
  nvcc --version | tail -2; echo "which ncu: $(which ncu)"; ls -la /usr/local/cuda/bin/ncu; ncu --version
  python3 - <<'PY'
import importlib, platform, sys
print("python", sys.version.split()[0], platform.platform())
for m in ("numpy", "cupy", "torch", "triton", "pydantic", "pytest"):
    try: print(m, importlib.import_module(m).__version__)
    except Exception as e: print(m, "MISSING", e)
import cupy
p = cupy.cuda.runtime.getDeviceProperties(0)
print("gpu", p["name"], f"sm_{p['major']}{p['minor']}", "driver", cupy.cuda.runtime.driverGetVersion(),
      "runtime", cupy.cuda.runtime.runtimeGetVersion())
PY
} > $OUT/versions.txt 2>&1; cat $OUT/versions.txt
ncu --list-sections > $OUT/ncu-sections.txt 2>&1
ncu --query-metrics --chip gh100 > /tmp/ncu-metrics-all.txt 2>&1
grep -E "^(launch__|sm__warps_active|sm__maximum_warps|dram__throughput|gpu__dram|gpu__compute_memory|sm__throughput|lts__t_sector_hit|l1tex__t_sector_hit|l1tex__t_(bytes|sectors)_pipe_lsu_mem_local|smsp__average_warps_issue_stalled|smsp__pcsamp_warps_issue_stalled)" \
  /tmp/ncu-metrics-all.txt > $OUT/ncu-metrics.txt; wc -l /tmp/ncu-metrics-all.txt $OUT/ncu-metrics.txt
echo "== capture (profile_capture.py)" | tee $LOG
( time timeout 240 python3 bench/gpu/profile_capture.py $OUT ) > $OUT/capture.txt 2>&1; echo "rc capture $?" | tee -a $LOG
cat $OUT/capture.txt
if ! ls $OUT/ncu-*.csv >/dev/null 2>&1; then  # our path failed: ncu by hand on a tiny CuPy kernel, stdout apart
  echo "== probe: ncu by hand" | tee -a $LOG
  timeout 90 ncu --target-processes all --clock-control none --csv --page raw --print-units base \
    --log-file $OUT/probe.csv --section SpeedOfLight --section WarpStateStats python3 -c "
import cupy as cp; x = cp.arange(1 << 20, dtype=cp.float32); (x * 2).sum(); cp.cuda.runtime.deviceSynchronize()" \
    > $OUT/probe-stdout.txt 2> $OUT/probe-stderr.txt; echo "rc probe $?" | tee -a $LOG
  head -c 3000 $OUT/probe.csv; echo; head -20 $OUT/probe-stdout.txt $OUT/probe-stderr.txt
fi
PT="python3 -m pytest -q -p no:cacheprovider -rfEs"
echo "== profiling tests" | tee -a $LOG
timeout -s INT 150 $PT --junitxml=$OUT/junit-p.xml tests/targets/test_cuda_profile.py tests/eval/test_profiling.py \
  tests/targets/test_cpu_vecreport.py >> $LOG 2>&1; echo "rc P $? at $(( $(date +%s) - T0 )) s" | tee -a $LOG
echo "== test_cuda.py + test_triton.py" | tee -a $LOG
timeout -s INT $(left 560) $PT --junitxml=$OUT/junit-a.xml tests/targets/test_cuda.py tests/targets/test_triton.py \
  >> $LOG 2>&1; echo "rc A $? at $(( $(date +%s) - T0 )) s" | tee -a $LOG
wait; ls -la $S | tee -a $LOG
grep -E "passed|failed|^FAILED|^ERROR|^rc " $LOG | tail -30
tar czf $REAL_OUT/call1.tgz -C $OUT . && cp $LOG $OUT/capture.txt $REAL_OUT/
