#!/usr/bin/env bash
# `moe export hf`, `moe import hf` and `moe logits` without transformers (docs/interop.md):
# - what an export writes: safetensors files that parse (header length, JSON, offsets tiling the data exactly), an
#   index naming every tensor once, fp32 and bf16 holding the same tensors; Qwen2-MoE for what Mixtral cannot
#   express; the BPE tokenizer of a prepared run;
# - import of an export (Mixtral, three Qwen2-MoE) and export again: byte-identical; the same logits; training goes
#   on from it; 16-bit weights widened exactly;
# - bad input, each exit 2 with a message naming the key, file, tensor or value, the directory exactly as it was:
#   missing or damaged checkpoints, keys no architecture can express, a BPE tokenizer changed or gone, an existing
#   --out (--overwrite replaces only a previous export), bad options; for import a truncated file, headers lying
#   about dtypes, offsets or their length, a missing shard, sizes that disagree, a tensor of another shape, a gated
#   Qwen2-MoE shared expert, --upcycle misused; for logits bad ids and inputs.
#
# Usage: test_export_hf.sh MOE_BINARY SOURCE_DIR
set -u

if [ $# -ne 2 ]; then
  echo "usage: $0 MOE_BINARY SOURCE_DIR" >&2
  exit 2
fi
moe=$1
config="$2/configs/tiny_moe.json"
for tool in python3 sha256sum; do
  command -v "$tool" > /dev/null || { echo "$tool not found" >&2; exit 1; }
done
unset OMPI_COMM_WORLD_SIZE PMI_SIZE PMIX_SIZE OMPI_COMM_WORLD_LOCAL_SIZE MPI_LOCALNRANKS

small=(--set train.steps=2 --set model.d_model=32 --set model.layers=2 --set model.heads=2
  --set model.ffn_hidden=32 --set moe.num_experts=4 --set moe.expert_hidden=32 --set train.seq_len=16
  --set train.global_batch=2 --set train.micro_batch=1 --set train.eval_sequences=2 --set train.threads=1
  --set checkpoint.every=2 --quiet)

passed=0
failed=0
pass() { passed=$((passed + 1)); }
fail() {
  failed=$((failed + 1))
  echo "FAIL [$case_name] $1"
}

work=$(mktemp -d "${TMPDIR:-/tmp}/moe_export_hf.XXXXXX") || { echo "mktemp -d failed" >&2; exit 1; }
trap 'rm -rf "$work" "$work.before" "$work.stdout" "$work.stderr"' EXIT
cd "$work" || exit 1

snapshot() {
  find . -printf '%y %p\n' | LC_ALL=C sort
  find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum
}

# run_case NAME EXIT_CODE COMMAND...: asserts the exit code and that stderr holds every string of `expect_err`;
# a case expecting exit 2 also that the directory is the same byte for byte afterwards.
expect_err=()
out="$work.stdout"
err="$work.stderr"
run_case() {
  case_name=$1
  local want_rc=$2
  shift 2
  snapshot > "$work.before"
  "$@" > "$out" 2> "$err"
  local rc=$?
  if [ "$rc" = "$want_rc" ]; then pass; else fail "exit code $rc, expected $want_rc; stderr: $(cat "$err")"; fi
  local needle
  for needle in "${expect_err[@]}"; do
    if grep -qF -- "$needle" "$err"; then pass; else fail "stderr lacks '$needle'; stderr: $(cat "$err")"; fi
  done
  if [ "$want_rc" = 2 ]; then
    if diff <(snapshot) "$work.before" > /dev/null; then
      pass
    else
      fail "the directory changed (something was written or overwritten):"
      diff <(snapshot) "$work.before" | sed 's/^/    /'
    fi
  fi
  expect_err=()
}
check() {
  case_name=$1
  shift
  if "$@"; then pass; else fail "assertion failed: $*"; fi
}
train() { # RUN_DIR [--set ...]
  local dir=$1
  shift
  "$moe" train --config "$config" "${small[@]}" "$@" --run-dir "$dir" > /dev/null 2> "$dir.err" \
    || { echo "setup: training $dir failed: $(cat "$dir.err")"; exit 1; }
  rm -f "$dir.err"
}

# ---- Setup: a run Mixtral expresses, and runs it cannot. ---------------------------------------------------------
train good
train shared --set moe.shared_experts=1
train dense --set moe.every=2
train sigmoid --set moe.router.score=sigmoid --set moe.router.normalize=false
train unnormalised --set moe.router.normalize=false --set moe.top_k=2
train biased --set moe.router.bias_balance.rate=0.001
train glm --set moe.router.score=sigmoid --set moe.router.bias_balance.rate=0.01 --set moe.shared_experts=1 \
  --set moe.every=2 --set model.ffn_hidden=48
train glm-dense-last --set moe.router.score=sigmoid --set moe.every=2 --set model.layers=3
"$moe" prep --input "$2/data/corpus/prose.txt" --out prepared --tokenizer train --vocab 300 > /dev/null 2>&1 \
  || { echo "setup: moe prep failed"; exit 1; }
train bpe --set model.vocab=300 --set 'data.sources=[{"name": "prose", "path": "prepared"}]'

# ---- What a good export writes ------------------------------------------------------------------------------------
run_case "export fp32" 0 "$moe" export hf good --out fp32 --max-shard-size 20KiB
run_case "export bf16" 0 "$moe" export hf good/checkpoints/step-00000002 --out bf16 --dtype bf16
case_name="safetensors files and index"
if python3 - fp32 bf16 > "$out" 2>&1 << 'PY'; then pass; else fail "$(cat "$out")"; fi
import json, os, struct, sys
def tensors(d):
    index = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    names = {}
    total = 0
    for f in sorted(set(index["weight_map"].values())):
        raw = open(os.path.join(d, f), "rb").read()
        n = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8:8 + n])
        assert (8 + n) % 8 == 0, f"{f}: data not 8-byte aligned"
        header.pop("__metadata__")
        spans = sorted(v["data_offsets"] for v in header.values())
        assert spans[0][0] == 0 and spans[-1][1] == len(raw) - 8 - n, f"{f}: offsets do not cover the data"
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])), f"{f}: gaps or overlaps"
        for name, v in header.items():
            assert index["weight_map"][name] == f and name not in names, name
            names[name] = (v["dtype"], v["shape"])
            total += v["data_offsets"][1] - v["data_offsets"][0]
    assert set(names) == set(index["weight_map"]), "index and files disagree"
    assert index["metadata"]["total_size"] == total, "total_size"
    return names, len(set(index["weight_map"].values()))
a, files = tensors(sys.argv[1])
b, _ = tensors(sys.argv[2])
assert files > 1, "expected several files at 20KiB"
assert len(a) == 1 + 2 * (6 + 1 + 3 * 4) + 2, len(a)
assert {k: v[1] for k, v in a.items()} == {k: v[1] for k, v in b.items()}
assert {v[0] for v in a.values()} == {"F32"} and {v[0] for v in b.values()} == {"BF16"}
assert a["model.layers.1.self_attn.q_proj.weight"][1] == [32, 32]
assert a["model.layers.0.block_sparse_moe.experts.3.w2.weight"][1] == [32, 32]
assert a["lm_head.weight"][1] == [256, 32]
cfg = json.load(open(os.path.join(sys.argv[1], "config.json")))
assert cfg["architectures"] == ["MixtralForCausalLM"] and cfg["num_local_experts"] == 4, cfg
PY
check "no partial directory left" test -z "$(ls -A | grep -E '^\.(fp32|bf16)\.(partial|old)-')"

# ---- Missing and damaged checkpoints --------------------------------------------------------------------------------
expect_err=("nowhere" "no such file or directory")
run_case "missing checkpoint" 2 "$moe" export hf nowhere --out x
mkdir -p empty_run
expect_err=("empty_run")
run_case "a directory that is no run" 2 "$moe" export hf empty_run --out x
cp -a good damaged
rank_file=$(ls damaged/checkpoints/step-00000002/rank-*.h5 | head -1)
printf 'X' | dd of="$rank_file" bs=1 seek=100 count=1 conv=notrunc 2> /dev/null
expect_err=("does not verify" "rank-")
run_case "damaged checkpoint" 2 "$moe" export hf damaged --out x
expect_err=("does not verify")
run_case "logits of a damaged checkpoint" 2 "$moe" logits damaged --tokens 1,2,3 --out l.json

# ---- What MixtralForCausalLM cannot express: refused naming the key and its value ----------------------------------
# Mixtral refuses what it cannot express, naming key and value; auto then takes Qwen2-MoE where that expresses it.
expect_err=("moe.shared_experts = 1" "MixtralForCausalLM cannot express it")
run_case "shared experts as Mixtral" 2 "$moe" export hf shared --out x --arch mixtral
expect_err=("moe.every = 2" "MixtralForCausalLM")
run_case "dense layers as Mixtral" 2 "$moe" export hf dense --out x --arch mixtral
expect_err=("moe.router.normalize = false" "MixtralForCausalLM")
run_case "unnormalised gates as Mixtral" 2 "$moe" export hf unnormalised --out x --arch mixtral
for run in shared dense unnormalised; do
  run_case "$run as Qwen2-MoE (auto)" 0 "$moe" export hf "$run" --out "$run-hf"
  check "$run-hf is a Qwen2MoeForCausalLM" grep -q '"Qwen2MoeForCausalLM"' "$run-hf/config.json"
done
check "the shared expert's gate is there, shut" python3 -c "
import json; t = json.load(open('shared-hf/model.safetensors.index.json'))['weight_map']
assert 'model.layers.1.mlp.shared_expert_gate.weight' in t and 'model.layers.0.mlp.shared_expert.down_proj.weight' in t"
check "a dense layer's MLP in Qwen2-MoE" python3 -c "
import json; t = json.load(open('dense-hf/model.safetensors.index.json'))['weight_map']
assert 'model.layers.0.mlp.gate_proj.weight' in t and 'model.layers.1.mlp.gate.weight' in t"
# Sigmoid scores: Glm4MoeForCausalLM (DeepSeek-V3's MoE block), the balancing bias as e_score_correction_bias, the
# dense first layers as first_k_dense_replace, unnormalised gates as norm_topk_prob false.
expect_err=("moe.router.score = sigmoid" "MixtralForCausalLM cannot express it")
run_case "sigmoid scores as Mixtral" 2 "$moe" export hf sigmoid --out x --arch mixtral
for run in sigmoid glm; do
  run_case "$run as Glm4-MoE (auto)" 0 "$moe" export hf "$run" --out "$run-hf"
  check "$run-hf is a Glm4MoeForCausalLM" grep -q '"Glm4MoeForCausalLM"' "$run-hf/config.json"
done
check "Glm4-MoE: the bias, the shared expert, the dense first layer" python3 -c "
import json, struct
t = json.load(open('glm-hf/model.safetensors.index.json'))['weight_map']
c = json.load(open('glm-hf/config.json'))
assert c['first_k_dense_replace'] == 1 and c['n_shared_experts'] == 1 and c['norm_topk_prob'] is True, c
assert c['n_group'] == 1 and c['topk_group'] == 1 and c['routed_scaling_factor'] == 1.0, c
assert 'model.layers.0.mlp.gate_proj.weight' in t and 'model.layers.1.mlp.shared_experts.down_proj.weight' in t
name = 'model.layers.1.mlp.gate.e_score_correction_bias'
f = open('glm-hf/' + t[name], 'rb'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n))
a, b = h[name]['data_offsets']; f.seek(8 + n + a); bias = struct.unpack('<4f', f.read(b - a))
assert h[name]['shape'] == [4] and any(v != 0 for v in bias), bias
assert 'model.layers.0.mlp.shared_experts.gate_proj.weight' not in t"
check "Glm4-MoE unnormalised, without shared experts" python3 -c "
import json; c = json.load(open('sigmoid-hf/config.json'))
assert c['first_k_dense_replace'] == 0 and c['n_shared_experts'] == 0 and c['norm_topk_prob'] is False, c
t = json.load(open('sigmoid-hf/model.safetensors.index.json'))['weight_map']
assert 'model.layers.0.mlp.shared_experts.down_proj.weight' in t  # width 0, so that transformers misses nothing"
expect_err=("moe.every = 2" "Glm4MoeForCausalLM cannot express it" "dense layer 2 follows MoE layer 1")
run_case "sigmoid scores, a dense layer after an MoE one" 2 "$moe" export hf glm-dense-last --out x
expect_err=("model.attention = mha" "DeepseekV3ForCausalLM cannot express it" "latent attention")
run_case "DeepSeek-V3 of multi-head attention" 2 "$moe" export hf glm --out x --arch deepseek_v3
expect_err=("moe.router.bias_balance.rate" "nor can Qwen2MoeForCausalLM")
run_case "balancing bias" 2 "$moe" export hf biased --out x
expect_err=("moe.router.bias_balance.rate" "Qwen2MoeForCausalLM cannot express it")
run_case "balancing bias as Qwen2-MoE" 2 "$moe" export hf biased --out x --arch qwen2_moe
expect_err=("--arch" "deepseek")
run_case "unknown --arch" 2 "$moe" export hf good --out x --arch deepseek

# ---- The tokenizer a BPE model was trained with: exported only while it is that file -------------------------------
run_case "export of a BPE model" 0 "$moe" export hf bpe --out bpe-hf
check "its tokenizer has the merges and end-of-document" python3 -c "
import json; t = json.load(open('bpe-hf/tokenizer.json'))
assert len(t['model']['vocab']) == 300 and len(t['model']['merges']) == 43, len(t['model']['merges'])
assert t['added_tokens'][0]['id'] == 256 and t['added_tokens'][0]['special']
assert json.load(open('bpe-hf/config.json'))['eos_token_id'] == 256"
cp prepared/tokenizer.bpe tokenizer.keep
printf '\n' >> prepared/tokenizer.bpe
expect_err=("prepared/tokenizer.bpe" "xxh64")
run_case "a tokenizer changed since training" 2 "$moe" export hf bpe --out x
rm prepared/tokenizer.bpe
expect_err=("prepared/tokenizer.bpe")
run_case "a tokenizer gone since training" 2 "$moe" export hf bpe --out x
mv tokenizer.keep prepared/tokenizer.bpe

# ---- --out ---------------------------------------------------------------------------------------------------------
mkdir -p mine
echo notes > mine/notes.txt
expect_err=("mine" "not empty" "--overwrite")
run_case "a non-empty --out" 2 "$moe" export hf good --out mine
expect_err=("notes.txt" "not a file an export writes")
run_case "--overwrite of a directory that is not an export" 2 "$moe" export hf good --out mine --overwrite
expect_err=("fp32" "not empty")
run_case "a previous export without --overwrite" 2 "$moe" export hf good --out fp32
echo x > afile
expect_err=("afile" "not a directory")
run_case "--out is a file" 2 "$moe" export hf good --out afile
expect_err=("no/such" "does not exist")
run_case "--out in a missing directory" 2 "$moe" export hf good --out no/such/dir
expect_err=("--max-shard-size" "12XB")
run_case "a bad --max-shard-size" 2 "$moe" export hf good --out x --max-shard-size 12XB
expect_err=("--dtype")
run_case "a bad --dtype" 2 "$moe" export hf good --out x --dtype fp16
expect_err=("name the directory itself")
run_case "--out ." 2 "$moe" export hf good --out .
expect_err=("inside a checkpoint directory")
run_case "--out inside a checkpoint" 2 "$moe" export hf good --out good/checkpoints/step-00000002/hf
expect_err=("inside a checkpoint directory")
run_case "import --out inside a checkpoint" 2 "$moe" import hf fp32 --config good/config.json \
  --out good/checkpoints/step-00000002/run
ln -s emptydir linked
expect_err=("linked" "not a directory")
run_case "--out is a symbolic link" 2 "$moe" export hf good --out linked
rm linked
run_case "--out with a trailing slash" 0 "$moe" export hf good --out slash/
check "the trailing slash names the directory" test -f slash/config.json
check "no partial directory inside it" test -z "$(ls -A slash | grep partial)"
mkdir -p emptydir
run_case "an empty --out" 0 "$moe" export hf good --out emptydir
check "the empty --out holds the export" test -f emptydir/config.json
before=$(sha256sum fp32/config.json)
run_case "--overwrite of a previous export" 0 "$moe" export hf good --out fp32 --overwrite
check "replaced by one shard" test "$(ls fp32/*.safetensors | wc -l)" = 1
check "the config is the same" test "$(sha256sum fp32/config.json)" = "$before"
check "no partial or old directory left" test -z "$(ls -A | grep -E '\.(partial|old)-')"

# ---- moe import hf: an export made a checkpoint again, byte for byte; hostile directories refused ----------------
cfg=good/config.json  # the run's resolved config: the model to import into
run_case "import of an export" 0 "$moe" import hf fp32 --config "$cfg" --out imported
run_case "export of the import" 0 "$moe" export hf imported --out again
for f in fp32/*; do
  check "$(basename "$f") byte-identical after import and export" cmp -s "$f" "again/$(basename "$f")"
done
"$moe" logits good --tokens 5,6,7 2> /dev/null | python3 -c "import json,sys; print(json.load(sys.stdin)['logits'])" > a.txt
"$moe" logits imported --tokens 5,6,7 2> /dev/null | python3 -c "import json,sys; print(json.load(sys.stdin)['logits'])" > b.txt
check "the imported model's logits are the original's" cmp -s a.txt b.txt
# 16-bit weights widened exactly: the bf16 export, and the fp32 one rounded to F16 in one model.safetensors (no
# index), imported and exported in fp32 hold exactly the 16-bit values.
cat > tensors.py << 'PY'
import json, os, struct, sys
def tensors(d):
    """name -> (dtype, shape, values as floats) of a model directory."""
    index = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    out = {}
    for f in files:
        raw = open(os.path.join(d, f), "rb").read()
        n = struct.unpack("<Q", raw[:8])[0]
        for name, v in json.loads(raw[8:8 + n]).items():
            if name == "__metadata__":
                continue
            b = raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
            if v["dtype"] == "F32":
                vals = struct.unpack("<%df" % (len(b) // 4), b)
            elif v["dtype"] == "F16":
                vals = struct.unpack("<%de" % (len(b) // 2), b)
            else:  # BF16: the upper half of an fp32
                vals = [struct.unpack("<f", b"\0\0" + b[i:i + 2])[0] for i in range(0, len(b), 2)]
            out[name] = (v["dtype"], v["shape"], list(vals))
    return out
if sys.argv[1] == "to_f16":  # SRC DST: every tensor rounded to F16, one model.safetensors
    src = tensors(sys.argv[2])
    header, data = {}, b""
    for name, (dtype, shape, vals) in sorted(src.items()):
        b = struct.pack("<%de" % len(vals), *vals)
        header[name] = {"dtype": "F16", "shape": shape, "data_offsets": [len(data), len(data) + len(b)]}
        data += b
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    os.makedirs(sys.argv[3])
    open(os.path.join(sys.argv[3], "model.safetensors"), "wb").write(struct.pack("<Q", len(text)) + text + data)
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        open(os.path.join(sys.argv[3], f), "w").write(open(os.path.join(sys.argv[2], f)).read())
else:  # same A B: the same values under the same names
    a, b = tensors(sys.argv[2]), tensors(sys.argv[3])
    assert a.keys() == b.keys(), set(a) ^ set(b)
    for name in a:
        assert a[name][1] == b[name][1] and a[name][2] == b[name][2], name
PY
# Qwen2-MoE exports (a shared expert; a dense layer; unnormalised gates) imported and exported again: byte-identical.
# So are Glm4-MoE exports (the balancing bias, a shared expert and a dense first layer; none of those).
for run in glm sigmoid; do
  run_case "import of the Glm4-MoE export of $run" 0 "$moe" import hf "$run-hf" --config "$run/config.json" \
    --out "$run-imported"
  run_case "its export" 0 "$moe" export hf "$run-imported" --out "$run-again"
  for f in "$run-hf"/*; do
    check "$run: $(basename "$f") byte-identical after import and export" cmp -s "$f" "$run-again/$(basename "$f")"
  done
done
expect_err=("first_k_dense_replace = 1" "moe.every")
run_case "import of a Glm4-MoE with a dense first layer into a config without" 2 "$moe" import hf glm-hf \
  --config glm/config.json --set moe.every=1 --out x
expect_err=("partial_rotary_factor")
cp -a glm-hf glm-partial
python3 -c "
import json; c = json.load(open('glm-partial/config.json')); c['rope_parameters']['partial_rotary_factor'] = 0.5
json.dump(c, open('glm-partial/config.json', 'w'))"
run_case "import of a Glm4-MoE rotating half of each head" 2 "$moe" import hf glm-partial --config glm/config.json \
  --out x
for run in shared dense unnormalised; do
  run_case "import of the Qwen2-MoE export of $run" 0 "$moe" import hf "$run-hf" --config "$run/config.json" \
    --out "$run-imported"
  run_case "its export" 0 "$moe" export hf "$run-imported" --out "$run-again"
  for f in "$run-hf"/*; do
    check "$run: $(basename "$f") byte-identical after import and export" cmp -s "$f" "$run-again/$(basename "$f")"
  done
done
cp -a shared-hf gated
python3 - << 'PY'
import glob, json, struct
for path in glob.glob("gated/*.safetensors"):
    raw = bytearray(open(path, "rb").read())
    n = struct.unpack("<Q", raw[:8])[0]
    t = json.loads(raw[8:8 + n]).get("model.layers.1.mlp.shared_expert_gate.weight")
    if t:
        raw[8 + n + t["data_offsets"][0]:8 + n + t["data_offsets"][0] + 4] = struct.pack("<f", 0.5)
        open(path, "wb").write(raw)
PY
expect_err=("shared_expert_gate.weight" "0.5" "only zeros")
run_case "import of a Qwen2-MoE whose shared expert is gated" 2 "$moe" import hf gated --config shared/config.json \
  --out x
python3 -c "
import json; c = json.load(open('gated/config.json')); c['shared_expert_intermediate_size'] = 64
json.dump(c, open('gated/config.json', 'w'))"
expect_err=("shared_expert_intermediate_size = 64" "moe.shared_experts * moe.expert_hidden = 32")
run_case "import of a Qwen2-MoE of another shared width" 2 "$moe" import hf gated --config shared/config.json \
  --out x
run_case "import of a bf16 export" 0 "$moe" import hf bf16 --config "$cfg" --out imported-bf16
run_case "its fp32 export" 0 "$moe" export hf imported-bf16 --out bf16-widened
check "the bf16 values widened exactly" python3 tensors.py same bf16 bf16-widened
check "an F16 copy in one model.safetensors" python3 tensors.py to_f16 fp32 f16
run_case "import of F16 tensors" 0 "$moe" import hf f16 --config "$cfg" --out imported-f16
run_case "its fp32 export" 0 "$moe" export hf imported-f16 --out f16-widened
check "the F16 values widened exactly" python3 tensors.py same f16 f16-widened
run_case "training continues from the import" 0 "$moe" train --config "$cfg" --run-dir imported --set train.steps=3 --quiet
check "it resumed at step 0 and trained 3 steps" python3 -c "
import json; lines = [json.loads(l) for l in open('imported/metrics.jsonl')]
assert [l['step'] for l in lines if 'loss' in l][-1] == 3, lines"

# Hostile copies of an export: each refused naming the file (and tensor), nothing written.
edit_header() { # FILE PYTHON-EXPRESSION-ON-h: rewrites the header, same length (padded with spaces)
  python3 - "$1" "$2" << 'PY'
import json, struct, sys
path, change = sys.argv[1], sys.argv[2]
raw = open(path, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n])
exec(change)
text = json.dumps(h, separators=(",", ":")).encode()
assert len(text) <= n, "the edited header is longer"
open(path, "wb").write(raw[:8] + text + b" " * (n - len(text)) + raw[8 + n:])
PY
}
cp -a fp32 hostile
truncate -s -10 hostile/model-00001-of-00001.safetensors
expect_err=("hostile/model-00001-of-00001.safetensors" "truncated")
run_case "import of a truncated safetensors file" 2 "$moe" import hf hostile --config "$cfg" --out x
rm -rf hostile && cp -a fp32 hostile
edit_header hostile/model-00001-of-00001.safetensors "h['lm_head.weight']['dtype'] = 'F16'"
expect_err=("lm_head.weight" "F16" "hold 32768 bytes" "is 16384 bytes")
run_case "import of a header that lies about a dtype" 2 "$moe" import hf hostile --config "$cfg" --out x
rm -rf hostile && cp -a fp32 hostile
edit_header hostile/model-00001-of-00001.safetensors \
  "t = h['model.norm.weight']; t['data_offsets'] = [t['data_offsets'][0] + 4, t['data_offsets'][1] + 4]"
expect_err=("model.norm.weight" "overlap or leave a gap")
run_case "import of a header that lies about offsets" 2 "$moe" import hf hostile --config "$cfg" --out x
rm -rf hostile && cp -a fp32 hostile
printf '\377\377\377\377\377\377\0\0' | dd of=hostile/model-00001-of-00001.safetensors conv=notrunc 2> /dev/null
expect_err=("header length")
run_case "import of a header length past the file" 2 "$moe" import hf hostile --config "$cfg" --out x
rm -rf hostile && cp -a fp32 hostile
"$moe" export hf good --out sharded --max-shard-size 20KiB > /dev/null
rm sharded/model-00002-of-*.safetensors
expect_err=("model-00002-of-" "a shard is missing")
run_case "import with a shard missing" 2 "$moe" import hf sharded --config "$cfg" --out x
expect_err=("num_local_experts = 4" "moe.num_experts = 8")
run_case "import into a config of another size" 2 "$moe" import hf fp32 --config "$cfg" --set moe.num_experts=8 \
  --out x
python3 -c "
import json; c = json.load(open('hostile/config.json')); c['intermediate_size'] = 16
json.dump(c, open('hostile/config.json', 'w'))"
expect_err=("experts.0.w1.weight" "[32,32]" "[16,32]" "from (moe.expert_hidden = 16, model.d_model = 32)")
run_case "import of a tensor of another shape" 2 "$moe" import hf hostile --config "$cfg" --set moe.expert_hidden=16 \
  --out x
expect_err=("moe.shared_experts = 1")
run_case "import into a config Mixtral cannot express" 2 "$moe" import hf fp32 --config "$cfg" \
  --set moe.shared_experts=1 --out x
expect_err=("--upcycle takes a dense llama model")
run_case "--upcycle of a Mixtral" 2 "$moe" import hf fp32 --upcycle --config "$cfg" --out x
cp -a fp32 dense-claimed
python3 -c "
import json; c = json.load(open('dense-claimed/config.json')); c['model_type'] = 'llama'
json.dump(c, open('dense-claimed/config.json', 'w'))"
expect_err=("model_type = llama" "needs --upcycle")
run_case "a dense model without --upcycle" 2 "$moe" import hf dense-claimed --config "$cfg" --out x
expect_err=("moe.shared_experts = 1" "--upcycle")
run_case "--upcycle into shared experts" 2 "$moe" import hf dense-claimed --upcycle --config "$cfg" \
  --set moe.shared_experts=1 --out x
expect_err=("has no tensor model.layers.0.mlp.gate_proj.weight")
run_case "--upcycle of a directory without the dense MLP" 2 "$moe" import hf dense-claimed --upcycle --config "$cfg" \
  --out x
expect_err=("--upcycle-noise 0.1" "needs --upcycle")
run_case "--upcycle-noise without --upcycle" 2 "$moe" import hf fp32 --upcycle-noise 0.1 --config "$cfg" --out x
expect_err=("--upcycle-noise")
run_case "a negative --upcycle-noise" 2 "$moe" import hf dense-claimed --upcycle --upcycle-noise -0.1 --config "$cfg" \
  --out x
expect_err=("checkpoint.dir = /tmp/elsewhere")
run_case "import with an absolute checkpoint.dir" 2 "$moe" import hf fp32 --config "$cfg" \
  --set checkpoint.dir=/tmp/elsewhere --out x
expect_err=("imported" "exists")
run_case "import into an existing --out" 2 "$moe" import hf fp32 --config "$cfg" --out imported

# ---- moe logits ----------------------------------------------------------------------------------------------------
run_case "logits of token ids" 0 "$moe" logits good --tokens "1, 2 3" --generate 2 --out l.json
case_name="logits JSON"
if python3 -c "
import json; d = json.load(open('l.json'))
assert d['tokens'] == [1, 2, 3] and len(d['logits']) == 3 and len(d['logits'][0]) == 256, d['tokens']
assert d['step'] == 2 and len(d['generated']) == 2 and all(0 <= t < 256 for t in d['generated'])
" 2> "$out"; then pass; else fail "$(cat "$out")"; fi
run_case "logits of text on standard output" 0 "$moe" logits good --text "ab"
check "two rows" python3 -c "import json,sys; d=json.load(open('$out')); assert d['tokens'] == [97, 98]"
expect_err=("--tokens" "300" "model.vocab = 256")
run_case "a token id past the vocabulary" 2 "$moe" logits good --tokens 1,300 --out l2.json
expect_err=("--tokens" "x")
run_case "a token that is no number" 2 "$moe" logits good --tokens 1,x --out l2.json
expect_err=("exactly one of --tokens, --text and --text-file")
run_case "two inputs" 2 "$moe" logits good --tokens 1 --text a --out l2.json
expect_err=("exactly one of")
run_case "no input" 2 "$moe" logits good --out l2.json
expect_err=("--text-file" "nofile")
run_case "a missing --text-file" 2 "$moe" logits good --text-file nofile --out l2.json
expect_err=("--out" "does not exist")
run_case "logits --out in a missing directory" 2 "$moe" logits good --tokens 1 --out no/such/l.json
expect_err=("nowhere")
run_case "logits of a missing checkpoint" 2 "$moe" logits nowhere --tokens 1

# ---- DeepseekV3ForCausalLM: latent attention with its latents' norms and DeepSeek-V3's MoE block --------------------
mla=(--set model.attention=mla --set model.mla.kv_rank=8 --set model.mla.q_rank=12 --set model.mla.rope_dim=4
  --set moe.router.score=sigmoid --set moe.router.bias_balance.rate=0.01 --set moe.shared_experts=1 --set moe.every=2
  --set model.ffn_hidden=48)
train dsv3 "${mla[@]}" --set model.mla.norms=true
train dsv3-unnormed "${mla[@]}"
train dsv3-softmax --set model.attention=mla --set model.mla.norms=true
run_case "DeepSeek-V3 (auto)" 0 "$moe" export hf dsv3 --out dsv3-hf --max-shard-size 8KiB
check "dsv3-hf is a DeepseekV3ForCausalLM" grep -q '"DeepseekV3ForCausalLM"' dsv3-hf/config.json
check "DeepSeek-V3: its config, the stacked projections whole, the norms" python3 -c "
import json, struct
c = json.load(open('dsv3-hf/config.json'))
want = dict(kv_lora_rank=8, q_lora_rank=12, qk_rope_head_dim=4, qk_nope_head_dim=16, v_head_dim=16,
            rope_interleave=True, first_k_dense_replace=1, n_shared_experts=1, n_group=1, topk_group=1,
            routed_scaling_factor=1.0, model_type='deepseek_v3')
assert all(c[k] == v for k, v in want.items()), c
t = json.load(open('dsv3-hf/model.safetensors.index.json'))['weight_map']
shapes = {}
for f in set(t.values()):
    raw = open('dsv3-hf/' + f, 'rb').read(); n = struct.unpack('<Q', raw[:8])[0]
    shapes.update({k: v['shape'] for k, v in json.loads(raw[8:8 + n]).items() if k != '__metadata__'})
a = 'model.layers.0.self_attn.'
assert shapes[a + 'q_b_proj.weight'] == [2 * (16 + 4), 12], shapes
assert shapes[a + 'kv_a_proj_with_mqa.weight'] == [8 + 4, 32] and shapes[a + 'kv_b_proj.weight'] == [64, 8], shapes
assert shapes[a + 'q_a_layernorm.weight'] == [12] and shapes[a + 'kv_a_layernorm.weight'] == [8], shapes
assert set(shapes) == set(t), 'one entry per tensor'"
run_case "DeepSeek-V3 bf16" 0 "$moe" export hf dsv3 --out dsv3-bf16 --dtype bf16 --arch deepseek_v3
expect_err=("model.mla.norms = false" "DeepseekV3ForCausalLM cannot express it" "kv_a_layernorm")
run_case "DeepSeek-V3 of latents without norms" 2 "$moe" export hf dsv3-unnormed --out x --arch deepseek_v3
expect_err=("model.mla.norms = false" "nor DeepseekV3ForCausalLM")
run_case "latents without norms (auto)" 2 "$moe" export hf dsv3-unnormed --out x
expect_err=("moe.router.score = softmax" "DeepseekV3ForCausalLM cannot express it" "sigmoid")
run_case "DeepSeek-V3 of softmax scores" 2 "$moe" export hf dsv3-softmax --out x --arch deepseek_v3
expect_err=("model.attention = mla" "Glm4MoeForCausalLM cannot express it")
run_case "latent attention as Glm4-MoE" 2 "$moe" export hf dsv3 --out x --arch glm4_moe
run_case "import of the DeepSeek-V3 export" 0 "$moe" import hf dsv3-hf --config dsv3/config.json --out dsv3-imported
run_case "export of that import" 0 "$moe" export hf dsv3-imported --out dsv3-again --max-shard-size 8KiB
for f in dsv3-hf/*; do
  check "DeepSeek-V3 $(basename "$f") byte-identical after import and export" cmp -s "$f" "dsv3-again/$(basename "$f")"
done
"$moe" logits dsv3 --tokens 5,6,7 2> /dev/null | python3 -c "import json,sys; print(json.load(sys.stdin)['logits'])" > a.txt
"$moe" logits dsv3-imported --tokens 5,6,7 2> /dev/null |
  python3 -c "import json,sys; print(json.load(sys.stdin)['logits'])" > b.txt
check "the imported DeepSeek-V3's logits are the original's" cmp -s a.txt b.txt
# config.json fields this project's latent attention cannot take: each refused by name, nothing written.
for edit in "q_lora_rank=None" "rope_interleave=False" "kv_lora_rank=16" "qk_rope_head_dim=8" "v_head_dim=8" \
  "routed_scaling_factor=2.5" "n_group=2"; do
  rm -rf dsv3-edited && cp -r dsv3-hf dsv3-edited
  python3 -c "
import json, sys
k, v = sys.argv[1].split('=')
c = json.load(open('dsv3-edited/config.json')); c[k] = eval(v); json.dump(c, open('dsv3-edited/config.json', 'w'))" "$edit"
  expect_err=("dsv3-edited/config.json" "${edit%%=*}")
  run_case "DeepSeek-V3 import with $edit" 2 "$moe" import hf dsv3-edited --config dsv3/config.json --out x
done
# Queries without a latent (model.mla.q_rank = 0): q_proj (its rows per head [content | rotary]), no q_a_proj nor
# q_a_layernorm, q_lora_rank null; imported and exported again byte-identical, the same logits; an import of it
# into a config with a query latent refused naming both.
train dsv3-direct "${mla[@]}" --set model.mla.norms=true --set model.mla.q_rank=0
run_case "DeepSeek-V3 without a query latent" 0 "$moe" export hf dsv3-direct --out direct-hf
check "direct queries: q_proj, q_lora_rank null, no query latent" python3 -c "
import json, struct
c = json.load(open('direct-hf/config.json'))
assert c['q_lora_rank'] is None, c
shapes = {}
for f in set(json.load(open('direct-hf/model.safetensors.index.json'))['weight_map'].values()):
    raw = open('direct-hf/' + f, 'rb').read(); n = struct.unpack('<Q', raw[:8])[0]
    shapes.update({k: v['shape'] for k, v in json.loads(raw[8:8 + n]).items() if k != '__metadata__'})
a = 'model.layers.0.self_attn.'
assert shapes[a + 'q_proj.weight'] == [2 * (16 + 4), 32], shapes
assert not [k for k in shapes if 'q_a_' in k or 'q_b_' in k], shapes"
run_case "import of that export" 0 "$moe" import hf direct-hf --config dsv3-direct/config.json --out direct-imported
run_case "export of that import" 0 "$moe" export hf direct-imported --out direct-again
for f in direct-hf/*; do
  check "direct queries: $(basename "$f") byte-identical after import and export" cmp -s "$f" "direct-again/$(basename "$f")"
done
expect_err=("direct-hf/config.json" "q_lora_rank = null" "model.mla.q_rank = 12")
run_case "an import without a query latent into a config with one" 2 "$moe" import hf direct-hf \
  --config dsv3-direct/config.json --set model.mla.q_rank=12 --out x
expect_err=("model.mla.norms = false" "DeepseekV3ForCausalLM cannot express it")
run_case "DeepSeek-V3 import into latents without norms" 2 "$moe" import hf dsv3-hf --config dsv3/config.json \
  --set model.mla.norms=false --out x

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
