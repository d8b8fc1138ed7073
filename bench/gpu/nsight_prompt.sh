#!/bin/bash
# Issue 20 on the H200: a cuda plan:refine prompt carrying Nsight Compute metrics (bench/nsight_refine_prompt.py).
# Carries .device (wheels of what the image lacks: pydantic & co., pyelftools). Brings back the machine facts, the
# log, the first refine prompt and every prompt in one tarball (the device tool returns at most 8 files).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/kdeps .device/wheels/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD/src:/tmp/kdeps:$PWD KSEARCH_BUSY_WAIT_S=0 PYTHONUNBUFFERED=1 KSEARCH_HOME=/tmp/kh
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.used,utilization.gpu --format=csv; ncu --version | tail -1
  git log --oneline -1; uptime; } > $OUT/machine.txt 2>&1
cat $OUT/machine.txt
W=/tmp/nsight
timeout 200 python3 bench/nsight_refine_prompt.py $W > $OUT/log.txt 2>&1; rc=$?
tail -80 $OUT/log.txt
tar czf $OUT/prompts.tar.gz -C $W prompts
first=$(ls $W/prompts/*-plan-refine.md 2>/dev/null | head -1)
[ -n "$first" ] && cp "$first" $OUT/refine-prompt.md
exit $rc
