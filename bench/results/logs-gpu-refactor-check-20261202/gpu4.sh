#!/bin/bash
# Refactor check on the H200, call 4 (a fresh machine, the session's last device minutes): a few attention-prefill
# GPU tests in one process, in order (call 3's five parallel workers timed out computing the same float64
# references at once), cut by SIGINT at 190 s. Carries .device/wheels.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/kdeps .device/wheels/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD/src:/tmp/kdeps KSEARCH_BUSY_WAIT_S=0 PYTHONUNBUFFERED=1
P=tests/knowledge/test_attention_gpu.py
timeout -s INT 190 python3 -m pytest -q -s -p no:cacheprovider -rfEs --junitxml=$OUT/junit-f.xml \
  "$P::test_naive_kernel_passes[cuda-attention-prefill]" "$P::test_single_move_passes[cuda:flash-attention-prefill]" \
  "$P::test_naive_kernel_passes[triton-attention-prefill]" "$P::test_single_move_passes[triton:flash-attention-prefill]" \
  "$P::test_single_move_passes[triton:flash,tma-attention-prefill]" > $OUT/log4.txt 2>&1
echo "rc $?"; grep -E "^GPU |passed|failed|^FAILED|Timeout" $OUT/log4.txt | tail -20
