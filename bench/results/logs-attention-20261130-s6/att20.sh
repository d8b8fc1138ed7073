# 2026-11-30 (sixth session): compile_module compiles one NVRTC program per kernel, 8 at once; GPU tests; load probe; short search
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --target /tmp/kdeps .device/wheels/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=$PWD/src:/tmp/kdeps KSEARCH_HOME=/tmp/kh PYTHONUNBUFFERED=1
python3 .device/probe_load.py .device/c12/decode-default.json 2>&1 | tail -4
el probe
timeout 100 python3 -m pytest -q -x -m cuda -p no:cacheprovider --timeout 90 tests/targets/test_cuda.py tests/eval/adversarial/test_cuda_exploits.py > $OUT/pytest.log 2>&1
el "pytest rc=$?"; tail -4 $OUT/pytest.log | cut -c1-200
timeout 230 python3 -m pytest -q -s -m cuda -k "not triton" -p no:cacheprovider --timeout 120 --durations=5 tests/knowledge/test_attention_decode_gpu.py > $OUT/pytest-decode.log 2>&1
el "pytest decode rc=$?"; tail -14 $OUT/pytest-decode.log | cut -c1-200
timeout 120 python3 -m ksearch run attention-decode --target cuda --time-limit 45 -w tiny-L1,odd-b7,llama3-8b-b1-kv16k > $OUT/run.log 2>&1
el "search rc=$?"; grep "load\|best score\|final" $OUT/run.log | head -14 | cut -c1-160
