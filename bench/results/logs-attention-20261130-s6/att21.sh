# 2026-11-30 (sixth session): with the one-compile worker, a cuda decode search over the checks and the four bench shapes; its best benched beside cuDNN
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --target /tmp/kdeps .device/wheels/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=$PWD/src:/tmp/kdeps KSEARCH_HOME=/tmp/kh PYTHONUNBUFFERED=1
W=tiny-L1,odd-b7,d80,large-logits,llama3-8b-b1-kv16k,llama3-8b-b8-kv4k,llama3-8b-b32-kv4k,qwen3-0.6b-b8-kv16k
timeout 340 python3 -m ksearch run attention-decode --target cuda --time-limit 200 -w $W > $OUT/run.log 2>&1
el "search rc=$?"; grep -v "^\s*$" $OUT/run.log | grep -v "kv_len=\|head_dim=" | tail -24 | cut -c1-180
RUN=$(ls -t $KSEARCH_HOME/runs | head -1); cp $KSEARCH_HOME/runs/$RUN/best/candidate.json $OUT/best.json || exit 0
python3 -m ksearch show $RUN > $OUT/tree.txt 2>&1
mkdir -p $OUT/bd
timeout 100 python3 bench/gpu/attention_h200.py --out $OUT/bd --deadline-s 80 --baselines sdpa-cudnn \
  --tasks attention-decode --workloads llama3-8b-b1-kv16k,llama3-8b-b8-kv4k,llama3-8b-b32-kv4k,qwen3-0.6b-b8-kv16k --budget-s 0.3 \
  --candidate attention-decode:$OUT/best.json > $OUT/bench.log 2>&1
el "bench rc=$?"; grep -h "^| " $OUT/bd/*.md | grep -v "\-\-\- \|naive\|implementation" | cut -c1-200 | head -14
