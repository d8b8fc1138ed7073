#!/bin/bash
# Issue 18 on the H200: the paired, block-timed judge on the cuda target (first run on a GPU).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/kdeps .device/wheels/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD/src:/tmp/kdeps KSEARCH_HOME=/tmp/kh KSEARCH_BUSY_WAIT_S=0
nvidia-smi --query-gpu=name,driver_version,memory.used,utilization.gpu --format=csv | tee $OUT/nvidia-smi.txt
python3 -c "import cupy, torch, triton; print('cupy', cupy.__version__, 'torch', torch.__version__, 'triton', triton.__version__)" | tee $OUT/versions.txt
echo "== GPU tests" | tee $OUT/tests.log
timeout 280 python3 -m pytest -q -m cuda -p no:cacheprovider tests/targets/test_cuda.py tests/eval/adversarial/test_cuda_exploits.py 2>&1 | tail -25 | tee -a $OUT/tests.log
echo "== ksearch eval (paired beside naive, device-timed blocks)" | tee $OUT/eval.log
timeout 120 python3 -m ksearch eval selective-scan-fp16 src/ksearch/tasks/builtin/selective-scan-fp16/naive.cuda.cu --target cuda -w tiny,mamba370m-L2048,mamba370m-L4096 --json > $OUT/eval.json 2>> $OUT/eval.log; echo "rc $?" >> $OUT/eval.log
python3 - <<'PY' | tee -a $OUT/eval.log
import json, os
d = json.load(open(os.environ["OUT"] + "/eval.json"))
print(d["status"], d["message"][:300])
for w in d["workloads"]:
    print(w["name"], w["status"], w["median_ms"], w["clock"], w["repeats"], [(p["role"], p["ratio"], p["lo"], p["hi"], p["verdict"], p["n"]) for p in w["paired"]])
print("combined", [(p["role"], p["ratio"], p["lo"], p["hi"], p["verdict"]) for p in d["paired"]])
PY
echo "== search" | tee $OUT/run.log
timeout 200 python3 -m ksearch run selective-scan-fp16 --target cuda --time-limit 90 -w tiny,long-state,mamba370m-L2048,mamba370m-L4096 >> $OUT/run.log 2>&1; echo "rc $?" >> $OUT/run.log
tail -40 $OUT/run.log
