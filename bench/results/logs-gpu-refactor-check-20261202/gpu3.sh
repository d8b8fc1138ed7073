#!/bin/bash
# Refactor check on the H200, call 3 (a fresh machine): what call 1's limit cut (exploits, nvrtc, the
# selective-scan cuda pack, baselines) beside a sample of the attention GPU packs (prefill causal: each naive
# kernel and each family's default path, Triton's TMA move; three decode moves call 1 did not reach). Both
# groups run at once (xdist), each cut by SIGINT before the call's limit. Carries .device/wheels.
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --target /tmp/kdeps .device/wheels/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD/src:/tmp/kdeps KSEARCH_BUSY_WAIT_S=0 PYTHONUNBUFFERED=1
PT="python3 -m pytest -q -p no:cacheprovider -rfEs"
P=tests/knowledge/test_attention_gpu.py; D=tests/knowledge/test_attention_decode_gpu.py
timeout -s INT 330 $PT -n 3 --junitxml=$OUT/junit-d.xml tests/eval/adversarial/test_cuda_exploits.py \
  tests/targets/test_nvrtc.py tests/knowledge/test_selective_scan_cuda.py tests/eval/test_baselines.py \
  > $OUT/log3d.txt 2>&1 &
timeout -s INT 400 $PT -n 5 --junitxml=$OUT/junit-e.xml \
  "$P::test_naive_kernel_passes[cuda-attention-prefill]" "$P::test_naive_kernel_passes[triton-attention-prefill]" \
  "$P::test_single_move_passes[cuda:naive-rows-attention-prefill]" "$P::test_single_move_passes[cuda:flash-attention-prefill]" \
  "$P::test_single_move_passes[triton:naive-blocks-attention-prefill]" "$P::test_single_move_passes[triton:flash-attention-prefill]" \
  "$P::test_single_move_passes[triton:flash,tma-attention-prefill]" "$D::test_single_move_passes[cuda:split-kv]" \
  "$D::test_single_move_passes[triton:split-kv]" "$D::test_single_move_passes[triton:split-kv,together]" \
  > $OUT/log3e.txt 2>&1 &
wait; echo "done at $(( $(date +%s) - T0 )) s"
grep -v PytestBenchmarkWarning $OUT/log3d.txt | grep -v "warner(" | tail -25; grep -v PytestBenchmarkWarning $OUT/log3e.txt | grep -v "warner(" | tail -25
