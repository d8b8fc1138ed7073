#!/bin/bash
# Issue 26 on the lent GPU, call 1 of 2: the selective scan with its initial state h0 (every pack path checked on
# the h0 workloads too) beside mamba_ssm's CUDA kernel (built from the sdist in .device/mamba), batch 1 and 8,
# L 512..4096 (bench/gpu/selective_scan_h200.py); also stashes MLX part 1 (.device/mlx1) in $S for call 2
# (bench/gpu/mlx_prefill_h200.sh), which must follow at once (the machine stays warm ~30 s).
# Carry: .device/wheels .device/mamba .device/mlx1
set -u
S=/tmp/mlxS; mkdir -p $S; cp .device/mlx1/* $S/ &
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.used,utilization.gpu --format=csv; uptime; } 2>&1 | tee $OUT/machine.txt
python3 -m pip install -q --no-index --no-deps --target /tmp/kdeps .device/wheels/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD/src:/tmp/kdeps PYTHONUNBUFFERED=1 MAX_JOBS=16
timeout "${LIMIT:-540}" python3 bench/gpu/selective_scan_h200.py --mamba-src .device/mamba --out $OUT \
  --slow-budget-s 0.2 > $OUT/log.txt 2>&1; echo "rc $?" >> $OUT/log.txt
wait
{ echo "after:"; uptime; nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv; } >> $OUT/machine.txt 2>&1
grep -v "^\s*$" $OUT/log.txt | tail -70
