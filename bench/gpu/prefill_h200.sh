#!/bin/bash
# Issue 26 on the lent GPU: the attention triton pack's new prefill paths (128 x 128 tiles now that the shared-memory
# limit is Triton 3.6's real allocation; schedule=persistent; with and without TMA) beside the searched best of
# 2026-11-30 (n28 causal, its non-causal twin) and cuDNN SDPA, bf16, Llama-3-8B and Qwen3-0.6B at L 4k and 16k,
# causal and non-causal, one bench run (bench/gpu/attention_h200.py: every kernel checked before it is timed).
# Candidates: bench/gpu/prefill-cands-20261207/*.json (`ksearch knowledge render`, paths in each file's meta).
# Carry: .device/wheels
set -u
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.used,utilization.gpu --format=csv; uptime; } 2>&1 | tee $OUT/machine.txt
python3 -m pip install -q --no-index --no-deps --target /tmp/kdeps .device/wheels/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD/src:/tmp/kdeps PYTHONUNBUFFERED=1
D=bench/gpu/prefill-cands-20261207
C=(--candidate attention-prefill-bf16:bench/results/gpu-attention-prefill-bf16-searched-best-20261130.json
   --candidate attention-prefill-noncausal-bf16:bench/results/gpu-attention-prefill-noncausal-bf16-searched-best-20261130.json)
for f in $D/noncausal-bf16-*.json; do C+=(--candidate attention-prefill-noncausal-bf16:$f); done
for f in $D/bf16-*.json; do C+=(--candidate attention-prefill-bf16:$f); done
timeout "${LIMIT:-560}" python3 bench/gpu/attention_h200.py --out $OUT --deadline-s 480 --no-naive --baselines sdpa-cudnn \
  --tasks attention-prefill-bf16,attention-prefill-noncausal-bf16 \
  --workloads llama3-8b-L4k,qwen3-0.6b-L4k,llama3-8b-L16k,qwen3-0.6b-L16k --budget-s 0.4 "${C[@]}" > $OUT/log.txt 2>&1
echo "rc $?" >> $OUT/log.txt
{ echo "after:"; uptime; nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv; } >> $OUT/machine.txt 2>&1
grep -E "^\| (sdpa|searched|rendered)|^## |rc " $OUT/log.txt $OUT/*.md 2>/dev/null | cut -c1-220 | tail -80
