#!/bin/bash
# Issue 26 on the lent GPU: the attention-decode cuda pack's tensor-core family (mma-split: the group's query heads
# as the 16 rows of mma.sync tiles, per-warp cp.async rings) beside split-kv (its default and the cp.async path that
# was best at batch 32), the searched best of 2026-11-30 and cuDNN SDPA, fp16, at the four bench shapes (Llama-3-8B
# b1 kv16k, b8 kv4k, b32 kv4k, Qwen3-0.6B b8 kv16k), one bench run (bench/gpu/attention_h200.py: every kernel checked
# on the task's check workloads before it is timed; % of copy bandwidth beside a torch copy of the same bytes).
# Candidates: bench/gpu/decode-cands-20261208/*.json (`ksearch knowledge render`, paths in each file's meta).
# Carry: .device/wheels (bash bench/gpu/device_carry.sh wheels)
set -u
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.used,utilization.gpu --format=csv; uptime; } 2>&1 | tee $OUT/machine.txt
python3 -m pip install -q --no-index --no-deps --target /tmp/kdeps .device/wheels/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD/src:/tmp/kdeps PYTHONUNBUFFERED=1
C=(--candidate attention-decode:bench/results/gpu-attention-decode-searched-best-20261130.json)
for f in bench/gpu/decode-cands-20261208/*.json; do C+=(--candidate attention-decode:$f); done
timeout "${LIMIT:-560}" python3 bench/gpu/attention_h200.py --out $OUT --deadline-s 480 --no-naive --baselines sdpa-cudnn \
  --tasks attention-decode --workloads llama3-8b-b1-kv16k,llama3-8b-b8-kv4k,llama3-8b-b32-kv4k,qwen3-0.6b-b8-kv16k \
  --budget-s 0.4 "${C[@]}" > $OUT/log.txt 2>&1
echo "rc $?" >> $OUT/log.txt
{ echo "after:"; uptime; nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv; } >> $OUT/machine.txt 2>&1
grep -E "^\| |^## |rc |FAIL|fail|rror" $OUT/log.txt $OUT/*.md 2>/dev/null | cut -c1-240 | tail -90
