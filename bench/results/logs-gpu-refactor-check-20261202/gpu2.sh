#!/bin/bash
# Refactor check on the H200, call 2 of 2 (at once after call 1, same warm machine): MLX's CUDA backend
# assembled from the two parts, the mlx_cuda tests and tests/integrations; ksearch eval of the naive kernels
# on cuda, triton and mlx-cuda; a 3-evaluation ksearch run on cuda. Carries .device/wheels and .devmlx2.
set -u
T0=$(date +%s)
S=/tmp/mlxS; LOG=$OUT/log2.txt
[ -d /tmp/kdeps/pydantic ] || python3 -m pip install -q --no-index --no-deps --target /tmp/kdeps .device/wheels/*.whl
export PYTHONPATH=$PWD/src:/tmp/kdeps KSEARCH_BUSY_WAIT_S=0 PYTHONUNBUFFERED=1 KSEARCH_HOME=/tmp/kh
MLX=0
if [ -f $S/part.aa ]; then
  W=$S/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl
  cat $S/part.aa .devmlx2/part.ab > $W
  echo "94cb48fba73e5ee39467e51c35c51c691123359ca17bafd1a24cf92ad6732bee  $W" | sha256sum -c | tee $LOG
  python3 -m pip install -q --no-index --no-deps --no-compile --target $S/site $W $S/mlx-0.32.4-*.whl $S/mlx_lm-*.whl 2>&1 | tail -3
  ln -sfn "$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])')" $S/site/nvidia
  MLX=1
else echo "!! machine went cold: no MLX part 1, mlx tests skipped" | tee $LOG; fi
[ $MLX = 1 ] && export PYTHONPATH=$PYTHONPATH:$S/site
python3 -c "import mlx.core as mx; print('mlx', mx.__version__, 'cuda', mx.cuda.is_available(), mx.default_device())" 2>&1 | tee -a $LOG
python3 -c "from ksearch.targets.base import spec_for_target; print('spec mlx-cuda', spec_for_target('mlx-cuda').model_dump_json()[:600])" 2>&1 | tail -3 | tee -a $LOG
echo "== C: mlx_cuda tests + integrations" | tee -a $LOG
timeout -s INT 200 python3 -m pytest -q -p no:cacheprovider -rfEs --junitxml=$OUT/junit-c.xml -m "mlx_cuda or mlx" \
  tests/targets/test_mlx_gpu.py tests/targets/test_mlx.py tests/targets/test_mlx_spec.py tests/tasks/test_attention_tasks.py \
  tests/knowledge/test_attention_mlx_cuda_pack.py tests/integrations >> $LOG 2>&1; echo "rc C $? at $(( $(date +%s) - T0 )) s" | tee -a $LOG
grep -E "passed|failed|^FAILED|^ERROR" $LOG | tail -20
B=src/ksearch/tasks/builtin/selective-scan
for tg in cuda triton mlx-cuda; do
  case $tg in cuda) k=$B/naive.cuda.cu;; triton) k=$B/naive.triton.py;; mlx-cuda) k=$B/naive.mlx-cuda.cu;; esac
  [ $tg = mlx-cuda ] && [ $MLX = 0 ] && continue
  echo "== eval $tg: ksearch eval selective-scan $k --target $tg -w tiny,odd,small-b2,mamba370m-L512 --json" | tee -a $LOG
  ( time timeout 120 python3 -m ksearch eval selective-scan $k --target $tg -w tiny,odd,small-b2,mamba370m-L512 --json > $OUT/eval-$tg.json ) 2>> $LOG
  echo "rc eval $tg $?" | tee -a $LOG
  python3 -c "
import json,sys; d=json.load(open('$OUT/eval-$tg.json')); print(d['status'], d['message'][:300])
for w in d['workloads']: print(' ', w['name'], w['status'], w['median_ms'], w.get('clock'), (w.get('message') or '')[:200])" 2>&1 | tee -a $LOG
done
echo "== run: ksearch run selective-scan --target cuda --budget 3 -w tiny,small-b2,mamba370m-L1024" | tee -a $LOG
( time timeout $(( 560 - ($(date +%s) - T0) )) python3 -m ksearch run selective-scan --target cuda --budget 3 -w tiny,small-b2,mamba370m-L1024 ) > $OUT/run.log 2>&1
echo "rc run $?" | tee -a $LOG; tail -45 $OUT/run.log
