#!/bin/bash
# Issue 21 on the H200: the Ray path on one GPU, evaluations per hour beside the local inline judge
# (bench/throughput.py --target cuda --configs local:1,ray:1). Two calls back to back (bench/gpu/ray_wheels.sh
# first, here): `bash bench/gpu/throughput_h200.sh 1` carrying .device/ray1, then `... 2` carrying .device/ray2.
set -u
S=/tmp/ksearch-ray
if [ "$1" = 1 ]; then
  mkdir -p $S && cp .device/ray1/* $S/ && ls -la $S && exit 0
fi
cp .device/ray2/* $S/ || exit 1
cat $S/ray.part.aa $S/ray.part.ab > "$S/$(cat $S/ray.name)"
[ "$(sha256sum "$S/$(cat $S/ray.name)" | awk '{print $1}')" = "$(cat $S/ray.sha256)" ] || { echo "ray wheel damaged"; exit 1; }
python3 -m pip install -q --no-index --no-deps --target $S/site $S/*.whl 2>&1 | tail -3
export PYTHONPATH=$PWD/src:$S/site:$PWD KSEARCH_HOME=/tmp/kh PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.used,utilization.gpu --format=csv; uptime; } | tee $OUT/machine.txt
timeout 480 python3 bench/throughput.py --target cuda --task selective-scan-fp16 --configs local:1,ray:1 --budget 8 \
  -w tiny,odd,mamba370m-L2048 --out $OUT 2>&1 | tee $OUT/log.txt | tail -30
