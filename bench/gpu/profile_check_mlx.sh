#!/bin/bash
# Issue 20 GPU check, call 3 of 3 (at once after bench/gpu/profile_check2.sh, on the same warm machine): MLX's CUDA
# backend assembled from the two parts (shared/reference/device-recipes.md), then tests/targets/test_mlx_gpu.py.
# Carries .device/wheels and .devmlx2. Everything comes back as call4.tgz plus the log.
set -u
REAL_OUT=$OUT; OUT=/tmp/o2; mkdir -p $OUT
T0=$(date +%s)
S=/tmp/mlxS; LOG=$OUT/log2.txt
[ -d /tmp/kdeps/pydantic ] || python3 -m pip install -q --no-index --no-deps --target /tmp/kdeps .device/wheels/*.whl
export PYTHONPATH=$PWD/src:/tmp/kdeps:$PWD KSEARCH_BUSY_WAIT_S=0 PYTHONUNBUFFERED=1 KSEARCH_HOME=/tmp/kh
if [ -f $S/part.aa ]; then
  W=$S/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl
  cat $S/part.aa .devmlx2/part.ab > $W
  echo "94cb48fba73e5ee39467e51c35c51c691123359ca17bafd1a24cf92ad6732bee  $W" | sha256sum -c | tee $LOG
  python3 -m pip install -q --no-index --no-deps --no-compile --target $S/site $W $S/mlx-0.32.4-*.whl $S/mlx_lm-*.whl 2>&1 | tail -3
  ln -sfn "$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])')" $S/site/nvidia
  export PYTHONPATH=$PYTHONPATH:$S/site
else echo "!! machine went cold: no MLX part 1, the mlx_cuda tests will skip" | tee $LOG; fi
python3 -c "import mlx.core as mx; print('mlx', mx.__version__, 'cuda', mx.cuda.is_available(), mx.default_device())" 2>&1 | tee -a $LOG
echo "== test_mlx_gpu.py" | tee -a $LOG
timeout -s INT 300 python3 -m pytest -q -p no:cacheprovider -rfEs --junitxml=$OUT/junit-m.xml tests/targets/test_mlx_gpu.py \
  >> $LOG 2>&1; echo "rc M $? at $(( $(date +%s) - T0 )) s" | tee -a $LOG
grep -E "passed|failed|^FAILED|^ERROR|^rc " $LOG | tail -20
tar czf $REAL_OUT/call4.tgz -C $OUT . && cp $LOG $REAL_OUT/
