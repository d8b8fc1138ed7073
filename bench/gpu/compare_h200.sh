#!/bin/bash
# Issue 22 on the H200: `ksearch compare selective-scan-fp16 --target cuda --budget 40`, the three strategies with
# the offline patterns proposer, one repeat each, on tiny,odd,mamba370m-L2048 (15-16 s an evaluation on an H100,
# the naive kernel and each run's final table included: 234 and 258 s for runs of 16; so ~30 min at 40, more
# than one device call and likely more than one session's device time; on every bench workload an evaluation
# took ~26 s: 21 in 540 s). Resumable across calls: the compare's home (/tmp/khc) is kept while the machine
# stays warm, and each call brings it back as compare-state.tar.gz; copied to .device/compare-state.tar.gz here
# and carried, a fresh machine (or a later session) goes on from it.
# Carries .device/wheels (what the image lacks: pydantic & co., pyelftools).
#   bash bench/gpu/compare_h200.sh        (repeat until it prints EXIT 0)
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/kdeps .device/wheels/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD/src:/tmp/kdeps:$PWD PYTHONUNBUFFERED=1 KSEARCH_HOME=/tmp/khc
NAME=ss-cuda-compare-b40
if [ ! -d /tmp/khc ] && [ -f .device/compare-state.tar.gz ]; then
  mkdir -p /tmp/khc && tar xzf .device/compare-state.tar.gz -C /tmp/khc && rm -f /tmp/khc/ablations/$NAME/lock
fi
if [ -d /tmp/khc/ablations/$NAME ]; then
  ARGS=(--resume "$NAME")
else
  ARGS=(selective-scan-fp16 --target cuda --strategies worldmodel,evolve,random --budget 40 --repeats 1
        -w tiny,odd,mamba370m-L2048 --name "$NAME")
fi
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.used,utilization.gpu --format=csv; git log --oneline -1
  uptime; } > $OUT/machine.txt 2>&1
cat $OUT/machine.txt
timeout "${LIMIT:-540}" python3 -m ksearch compare "${ARGS[@]}" -o $OUT/compare-selective-scan-fp16-cuda-h200.md \
  > $OUT/log.txt 2>&1
rc=$?
grep -v "^\s*$" $OUT/log.txt | tail -60
tar czf $OUT/compare-state.tar.gz -C /tmp/khc .
echo "EXIT $rc"
exit $rc
