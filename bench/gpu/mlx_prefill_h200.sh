#!/bin/bash
# Issue 26 on the lent GPU, call 2 of 2 (right after bench/gpu/scan_h0_h200.sh, which left MLX part 1 in $S):
# mlx-cuda-13 0.32.4 + mlx 0.32.4 + mlx-lm 0.32.2 installed from the two parts (sha256 checked), then
# bench/mlx/mamba_prefill.py: mlx-lm's Mamba prefill (mamba-370m shape, random weights, float16, batch 1) stock
# (token loop) vs vectorized (an associative scan in MLX ops) vs patched (the exported scan module in
# .device/mlx2/scan_mlx.py: `ksearch knowledge render selective-scan-fp16 --target mlx-cuda --path ...` then
# `ksearch export --candidate`), prefill in 2048-token chunks so that L 4096 takes the cached state as h0.
# Carry: .device/wheels .device/mlx2
set -u
S=/tmp/mlxS
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.used,utilization.gpu --format=csv; uptime; ls -la $S; } 2>&1 | tee $OUT/machine.txt
if [ ! -f $S/mlxcuda.part.aa ]; then echo "part 1 missing: the machine went cold; run call 1 again"; exit 3; fi
cat $S/mlxcuda.part.aa .device/mlx2/mlxcuda.part.ab > $S/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl
(cd $S && sha256sum -c $OLDPWD/.device/mlx2/SHA256) || exit 4
python3 -m pip install -q --no-index --no-deps --target $S/site $S/*.whl .device/wheels/*.whl 2>&1 | tail -2
ln -sfn "$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])')" $S/site/nvidia
export PYTHONPATH=$S/site:$PWD/src PYTHONUNBUFFERED=1
python3 -c "import mlx.core as mx; print('mlx', mx.__version__, 'cuda', mx.cuda.is_available())" 2>&1 | tee -a $OUT/machine.txt
timeout "${LIMIT:-500}" python3 bench/mlx/mamba_prefill.py --scan .device/mlx2/scan_mlx.py --Ls 1024,2048,4096 \
  --stock-max-L 1024 --reps 3 --decode 4 --budget-s 40 --out $OUT > $OUT/log.txt 2>&1; echo "rc $?" >> $OUT/log.txt
{ echo "after:"; uptime; nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv; } >> $OUT/machine.txt 2>&1
grep -v "^\s*$" $OUT/log.txt | tail -60
