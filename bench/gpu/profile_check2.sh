#!/bin/bash
# Issue 20 GPU check, call 2 of 3: call 1 (bench/gpu/profile_check.sh) judged its candidates on the cpu target by
# mistake (the Evaluator's default); this call runs the capture on cuda and the cuda-marked profiling test, and
# copies MLX part 1 to $S for call 3 (bench/gpu/profile_check_mlx.sh). Carries .device and .devmlx1.
set -u
REAL_OUT=$OUT; OUT=/tmp/o3; mkdir -p $OUT
T0=$(date +%s)
S=/tmp/mlxS; mkdir -p $S; cp .devmlx1/* $S/ &
[ -d /tmp/kdeps/pydantic ] || python3 -m pip install -q --no-index --no-deps --target /tmp/kdeps .device/wheels/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD/src:/tmp/kdeps:$PWD KSEARCH_BUSY_WAIT_S=0 PYTHONUNBUFFERED=1 KSEARCH_HOME=/tmp/kh
LOG=$OUT/log3.txt
echo "== capture (profile_capture.py)" | tee $LOG
( time timeout 300 python3 bench/gpu/profile_capture.py $OUT ) > $OUT/capture.txt 2>&1; echo "rc capture $?" | tee -a $LOG
cat $OUT/capture.txt
echo "== profiling tests" | tee -a $LOG
timeout -s INT 200 python3 -m pytest -q -p no:cacheprovider -rfEs --junitxml=$OUT/junit-p.xml tests/targets/test_cuda_profile.py \
  tests/eval/test_profiling.py >> $LOG 2>&1; echo "rc P $? at $(( $(date +%s) - T0 )) s" | tee -a $LOG
wait; ls -la $S | tee -a $LOG
grep -E "passed|failed|^FAILED|^ERROR|^rc " $LOG | tail -20
tar czf $REAL_OUT/call3.tgz -C $OUT . && cp $LOG $OUT/capture.txt $REAL_OUT/
