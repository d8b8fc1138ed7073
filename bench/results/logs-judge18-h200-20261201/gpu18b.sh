#!/bin/bash
set -u
[ -d /tmp/kdeps/pydantic ] || python3 -m pip install -q --no-index --no-deps --target /tmp/kdeps .device/wheels/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD/src:/tmp/kdeps KSEARCH_HOME=/tmp/kh KSEARCH_BUSY_WAIT_S=0
echo "== ksearch eval (paired beside naive, device-timed blocks)" | tee $OUT/eval.log
( time timeout 200 python3 -m ksearch eval selective-scan-fp16 src/ksearch/tasks/builtin/selective-scan-fp16/naive.cuda.cu --target cuda -w tiny,mamba370m-L512,mamba370m-L2048 --json > $OUT/eval.json ) 2>> $OUT/eval.log; echo "rc $?" >> $OUT/eval.log
python3 - <<'PY' | tee -a $OUT/eval.log
import json, os
d = json.load(open(os.environ["OUT"] + "/eval.json"))
print(d["status"], d["message"][:300])
for w in d["workloads"]:
    print(w["name"], w["status"], w["median_ms"], w["clock"], w["repeats"], [(p["role"], p["ratio"], p["lo"], p["hi"], p["verdict"], p["n"]) for p in w["paired"]])
print("combined", [(p["role"], p["ratio"], p["lo"], p["hi"], p["verdict"]) for p in d["paired"]])
PY
tail -5 $OUT/eval.log
echo "== search" | tee $OUT/run.log
( time timeout 280 python3 -m ksearch run selective-scan-fp16 --target cuda --time-limit 90 -w tiny,small-b2,mamba370m-L1024,mamba370m-L2048 ) >> $OUT/run.log 2>&1; echo "rc $?" >> $OUT/run.log
tail -45 $OUT/run.log
