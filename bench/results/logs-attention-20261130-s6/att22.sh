# 2026-11-30 (sixth session): where a cuda decode evaluation's 14-21 s go on the big workloads (controller cProfile + per-workload wall)
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/kdeps .device/wheels/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=$PWD/src:/tmp/kdeps KSEARCH_HOME=/tmp/kh PYTHONUNBUFFERED=1
W=tiny-L1,llama3-8b-b8-kv4k,llama3-8b-b32-kv4k,qwen3-0.6b-b8-kv16k
timeout 110 python3 -m cProfile -o $OUT/ev.prof -m ksearch eval attention-decode .device/c12/decode-default.json --target cuda -w $W --json > $OUT/ev.json 2> $OUT/ev.err
echo "rc=$?"; tail -3 $OUT/ev.err | cut -c1-200
python3 -c "
import json; d=json.load(open('$OUT/ev.json'))
for w in d['workloads']: print(w['name'], w['status'], w.get('median_ms'), w.get('spread'))
" 2>&1 | head -12
python3 -c "
import pstats; p=pstats.Stats('$OUT/ev.prof'); p.sort_stats('cumulative').print_stats(60)" | grep -v '^\s*$' | tail -61 | cut -c1-170
