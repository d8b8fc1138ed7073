# MLX staging, call 2 of 2, at once after mlxA.sh on the warm machine: carry [".devmlx2", ".device"]
# then: the mlx-cuda attention packs judged, a short mlx decode search (its final stage times the mlx-sdpa in-run baseline), the bench's mlx baseline
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
S=/tmp/S
[ -f $S/part.aa ] || { echo "no $S/part.aa: the machine went cold, run mlxA.sh first"; exit 3; }
W=mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl
cat $S/part.aa .devmlx2/part.ab > $S/$W && echo "94cb48fba73e5ee39467e51c35c51c691123359ca17bafd1a24cf92ad6732bee  $S/$W" | sha256sum -c || exit 4
python3 -m pip install -q --no-index --no-deps --target $S/site $S/$W $S/mlx-0.32.4-*.whl 2>&1 | grep -v WARN | tail -2
ln -sfn "$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])')" $S/site/nvidia
python3 -m pip install -q --no-index --no-deps --target /tmp/kdeps .device/wheels/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=$PWD/src:/tmp/kdeps:$S/site KSEARCH_HOME=/tmp/kh PYTHONUNBUFFERED=1
python3 -c "import mlx.core as mx; print('mlx', mx.__version__, 'cuda', mx.cuda.is_available())" || exit 5
K="python3 -m ksearch"
mkdir -p $OUT/c
$K knowledge render attention-decode --target mlx-cuda --path family=split-kv -o $OUT/c/md.json
$K knowledge render attention-prefill --target mlx-cuda --path family=flash -o $OUT/c/mp.json
$K knowledge render attention-prefill-noncausal --target mlx-cuda --path family=flash -o $OUT/c/mpn.json
timeout 90 $K eval attention-decode $OUT/c/md.json --target mlx -w tiny-L1,odd-b7,d80,large-logits,llama3-8b-b8-kv4k --seeds 1 > $OUT/eval-md.log 2>&1
el "eval decode rc=$?"; grep -i "passed\|failed\|error" $OUT/eval-md.log | cut -c1-120 | head -8
timeout 90 $K eval attention-prefill $OUT/c/mp.json --target mlx -w tiny-L1,mha-odd,gqa-d128,d80,large-logits,qwen3-0.6b-L1k --seeds 1 > $OUT/eval-mp.log 2>&1
el "eval prefill rc=$?"; grep -i "passed\|failed\|error" $OUT/eval-mp.log | cut -c1-120 | head -8
timeout 60 $K eval attention-prefill-noncausal $OUT/c/mpn.json --target mlx -w tiny-L1,mha-odd,gqa-d128,d80,large-logits,qwen3-0.6b-L1k --seeds 1 > $OUT/eval-mpn.log 2>&1
el "eval prefill-noncausal rc=$?"; grep -i "passed\|failed\|error" $OUT/eval-mpn.log | cut -c1-120 | head -8
timeout 180 $K run attention-decode --target mlx --time-limit 45 -w tiny-L1,odd-b7,d80,large-logits,llama3-8b-b8-kv4k > $OUT/run-mlx-decode.log 2>&1
el "mlx decode search rc=$?"; grep -v "^\s*$" $OUT/run-mlx-decode.log | grep -v "kv_len=\|head_dim=" | tail -16 | cut -c1-200
mkdir -p $OUT/bd
timeout 120 python3 bench/gpu/attention_h200.py --out $OUT/bd --deadline-s 100 --baselines sdpa-cudnn,mlx \
  --tasks attention-decode,attention-prefill --workloads llama3-8b-b8-kv4k,qwen3-0.6b-L1k --budget-s 0.3 > $OUT/bench.log 2>&1
el "bench rc=$?"; grep -h "^| \|^## " $OUT/bd/*.md | grep -v "\-\-\- |" | cut -c1-160 | head -24
