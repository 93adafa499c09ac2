#!/usr/bin/env bash
# Grouped-query attention (model.kv_heads < model.heads) through transformers itself (installed as for
# test_hf_interop.sh, pinned by tests/requirements-hf.txt into VENV):
# - a small MoE model of 4 heads reading 2 key/value heads trained a few steps at tp 2 (each rank one key/value
#   head and its 2 query heads) is exported: config.json has num_key_value_heads 2, k_proj and v_proj 2 * 8 rows;
#   AutoModelForCausalLM loads a MixtralForCausalLM whose logits on held-out text agree with `moe logits` (fp32:
#   max relative difference <= 1e-4, KL <= 1e-8), whose loss agrees within 1e-5 and whose greedy generation of
#   32 tokens is the same;
# - a Mixtral that transformers made and saved (random weights, num_key_value_heads 2 of 4 heads) and a multi-query
#   one (1 of 4) are imported (moe import hf), their logits, language-model loss (within 1e-5) and greedy generation
#   agree with transformers', and they train on here at tp 2; a dense Llama of 2 key/value heads is upcycled into
#   the run's MoE model and computes the Llama's function;
# - bad input: a config whose model.kv_heads does not divide model.heads, or that disagrees with the directory's
#   num_key_value_heads, or with the checkpoint a run resumes, exits 2 naming the key and writes nothing.
# When the environment cannot be made (no network) the test fails, unless MOE_TEST_OFFLINE=1 says this machine is
# offline: then it is skipped (exit 77).
#
# Usage: test_hf_gqa.sh MOE_BINARY SOURCE_DIR VENV
set -eu

source "$(dirname "$0")/pinned_venv.sh"
venv_test_start moe_hf_gqa tests/requirements-hf.txt transformers --no-deps -- "$@"
small=(--set train.steps=4 --set model.d_model=32 --set model.layers=2 --set model.heads=4 --set model.kv_heads=2
  --set model.ffn_hidden=32 --set moe.num_experts=4 --set moe.expert_hidden=32 --set train.seq_len=64
  --set train.global_batch=4 --set train.micro_batch=1 --set train.eval_sequences=2 --set train.threads=1
  --set checkpoint.every=2 --quiet)
mpirun=(mpirun --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 --timeout 300)
[ "$(id -u)" = 0 ] && mpirun+=(--allow-run-as-root)
"${mpirun[@]}" -np 2 "$moe" train --config "$config" "${small[@]}" --set parallel.tp=2 --run-dir gqa > /dev/null

tail -n 1 "$src/data/corpus/prose.txt" | head -c 24 > prompt.txt
tail -c 1500 "$src/data/corpus/prose.txt" > sample.txt
"$moe" logits gqa --text-file prompt.txt --generate 32 --out gqa.json 2> /dev/null
"$moe" logits gqa --text-file sample.txt --out gqa.sample.json 2> /dev/null
"$moe" export hf gqa --out gqa-hf > /dev/null
"$venv/bin/python" - gqa-hf << 'PY'
import json, sys
from safetensors.numpy import load_file
d = sys.argv[1]
config = json.load(open(d + "/config.json"))
assert config["num_attention_heads"] == 4 and config["num_key_value_heads"] == 2, config
files = set(json.load(open(d + "/model.safetensors.index.json"))["weight_map"].values())
tensors = {k: v for f in files for k, v in load_file(d + "/" + f).items()}
for layer in range(2):
    for name, rows in (("q_proj", 32), ("k_proj", 16), ("v_proj", 16), ("o_proj", 32)):
        shape = tensors[f"model.layers.{layer}.self_attn.{name}.weight"].shape
        assert shape == (rows, 32), (layer, name, shape)
PY
"$venv/bin/python" "$src/tests/cli/check_hf_interop.py" gqa-hf gqa.json sample.txt gqa.sample.json

# Models transformers made: Mixtrals of 2 and 1 key/value heads for 4 heads, a dense Llama of 2.
"$venv/bin/python" - << 'PY'
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM
torch.manual_seed(13)
def randomised(model):
    with torch.no_grad():  # weights of the size training gives, so that routing and logits are not all alike
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
    return model
common = dict(vocab_size=256, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=64, rms_norm_eps=1e-5,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False)
for kv in (2, 1):
    config = MixtralConfig(num_key_value_heads=kv, num_local_experts=4, num_experts_per_tok=2, **common)
    randomised(MixtralForCausalLM(config)).save_pretrained(f"mixtral-kv{kv}")
randomised(LlamaForCausalLM(LlamaConfig(num_key_value_heads=2, **common))).save_pretrained("llama-kv2")
PY
# The run's config with KV key/value heads at tp TP.
with_kv_heads() { # KV TP OUT
  python3 -c "
import json, sys
c = json.load(open('gqa/config.json'))
c['model']['kv_heads'], c['parallel']['tp'] = int(sys.argv[1]), int(sys.argv[2])
json.dump(c, open(sys.argv[3], 'w'), indent=2)" "$@"
}
with_kv_heads 2 2 config-kv2.json
with_kv_heads 1 1 config-kv1.json  # multi-query: its one key/value head cannot be split over tp 2
for kv in 2 1; do
  "$moe" import hf "mixtral-kv$kv" --config "config-kv$kv.json" --out "imported-kv$kv" > /dev/null
  "$moe" logits "imported-kv$kv" --text-file prompt.txt --generate 32 --out "imported-kv$kv.json" 2> /dev/null
  "$venv/bin/python" "$src/tests/cli/check_hf_interop.py" "mixtral-kv$kv" "imported-kv$kv.json" - -
done
"${mpirun[@]}" -np 2 "$moe" train --config config-kv2.json --run-dir imported-kv2 --set train.steps=2 --quiet > /dev/null
grep -q '"step":2' imported-kv2/metrics.jsonl || { echo "FAIL: the imported run did not train" >&2; exit 1; }
"$moe" train --config config-kv1.json --run-dir imported-kv1 --set train.steps=2 --quiet > /dev/null
grep -q '"step":2' imported-kv1/metrics.jsonl || { echo "FAIL: the imported run did not train" >&2; exit 1; }
"$moe" import hf llama-kv2 --upcycle --config config-kv2.json --out upcycled > /dev/null
"$moe" logits upcycled --text-file prompt.txt --generate 32 --out upcycled.json 2> /dev/null
"$venv/bin/python" "$src/tests/cli/check_hf_interop.py" llama-kv2 upcycled.json - -

# Bad input: exit 2 naming the key, nothing written.
refused() { # WHAT EXPECTED_TEXT COMMAND...
  local what=$1 text=$2
  shift 2
  set +e
  "$@" > out.txt 2> err.txt
  local rc=$?
  set -e
  [ "$rc" = 2 ] || { echo "FAIL: $what: exit $rc, expected 2" >&2; cat err.txt >&2; exit 1; }
  grep -qF -- "$text" err.txt || { echo "FAIL: $what: the message does not name $text" >&2; cat err.txt >&2; exit 1; }
}
with_kv_heads 3 1 config-kv3.json
refused "kv_heads 3 of 4 heads" "model.kv_heads = 3" "$moe" import hf mixtral-kv2 --config config-kv3.json --out bad1
refused "kv_heads 3 of 4 heads (train)" "model.kv_heads = 3" "$moe" train --config config-kv3.json --run-dir bad2
refused "kv_heads 1 against num_key_value_heads 2" "num_key_value_heads" \
  "$moe" import hf mixtral-kv2 --config config-kv1.json --out bad3
refused "kv_heads 1 at tp 2" "model.kv_heads = 1" "$moe" train --config config-kv1.json --set parallel.tp=2 \
  --run-dir bad4
# A checkpoint of 2 key/value heads does not resume as one of another count (nor would one from before the key, of
# model.heads); the same count, given as model.heads or 0 where it is that, would.
refused "resume at another kv_heads" "model.kv_heads = 2 there, 1 here" "$moe" train --config config-kv2.json \
  --set model.kv_heads=1 --set parallel.tp=1 --allow-config-change model,parallel --run-dir imported-kv2
for d in bad1 bad2 bad3 bad4; do
  [ ! -e "$d" ] || { echo "FAIL: $d written by a refused command" >&2; exit 1; }
done
echo "ok: grouped-query attention exports and imports through transformers"
