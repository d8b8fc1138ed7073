# 2026-11-30 (sixth session): triton judge re-check after torch_spin refactor, a longer cuda decode search on the two small shapes, its best benched beside cuDNN, and profiled
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --target /tmp/kdeps .device/wheels/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=$PWD/src:/tmp/kdeps KSEARCH_HOME=/tmp/kh PYTHONUNBUFFERED=1
K="python3 -m ksearch"
mkdir -p $OUT/c
$K knowledge render attention-decode --target triton --path family=split-kv -o $OUT/c/td.json > /dev/null
timeout 60 $K eval attention-decode $OUT/c/td.json --target triton -w tiny-L1,llama3-8b-b1-kv16k,llama3-8b-b8-kv4k --seeds 1 > $OUT/eval-td.log 2>&1
el "triton eval rc=$?"; grep -i "passed\|failed\|error" $OUT/eval-td.log | cut -c1-140 | head -6
W=tiny-L1,odd-b7,d80,large-logits,llama3-8b-b1-kv16k,llama3-8b-b8-kv4k
timeout 300 $K run attention-decode --target cuda --time-limit 190 -w $W > $OUT/run.log 2>&1
el "search rc=$?"; grep -v "^\s*$" $OUT/run.log | grep -v "kv_len=\|head_dim=" | tail -30 | cut -c1-200
RUN=$(ls -t $KSEARCH_HOME/runs | head -1); cp $KSEARCH_HOME/runs/$RUN/best/candidate.json $OUT/best.json || exit 0
$K show $RUN > $OUT/tree.txt 2>&1
mkdir -p $OUT/bd
timeout 110 python3 bench/gpu/attention_h200.py --out $OUT/bd --deadline-s 90 --baselines sdpa-cudnn \
  --tasks attention-decode --workloads llama3-8b-b1-kv16k,llama3-8b-b8-kv4k,llama3-8b-b32-kv4k,qwen3-0.6b-b8-kv16k --budget-s 0.4 \
  --candidate attention-decode:$OUT/best.json > $OUT/bench.log 2>&1
el "bench rc=$?"; grep -h "^| " $OUT/bd/*.md | grep -v "\-\-\- \|naive\|implementation" | cut -c1-200 | head -16
timeout 60 python3 bench/gpu/attention_profile.py --workloads llama3-8b-b1-kv16k,llama3-8b-b8-kv4k $OUT/best.json --out $OUT/prof > $OUT/prof.log 2>&1
el "profile rc=$?"; tail -20 $OUT/prof.log | cut -c1-200
