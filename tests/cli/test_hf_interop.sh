#!/usr/bin/env bash
# `moe export hf`'s directories loaded by transformers itself, installed from PyPI at the versions of
# tests/requirements-hf.txt into a virtual environment VENV (made or remade only when missing or made from another
# version of that file; `pip install --no-deps`, so exactly the pinned set):
# - a small MoE model trained a few steps at tp 2 x ep 2 (4 ranks, router temperature 0.7 to fold) and one at
#   pp 2 x ep 2 (a delta checkpoint on top) are exported; AutoModelForCausalLM loads a MixtralForCausalLM whose
#   logits on held-out text agree with `moe logits` (fp32: max relative difference <= 1e-4, KL <= 1e-8), and
#   greedy generation of 32 tokens gives the same tokens;
# - the bf16 export agrees within bf16's rounding;
# - the same for Qwen2MoeForCausalLM: a dense layer, a shared expert, unnormalised gates (tp 2 x ep 2), and a model
#   without shared experts;
# - the same for Glm4MoeForCausalLM (DeepSeek-V3's MoE block): sigmoid scores with a learned balancing bias, a
#   dense first layer, a shared expert (tp 2 x ep 2), and top-1 routing;
# - AutoTokenizer encodes and decodes a corpus sample exactly as the byte tokenizer does, and, for a model trained
#   on data prepared with a learned BPE (moe prep, vocab 320) at ep 2, as that BPE does (its chunking included:
#   runs longer than 64 bytes, white space before words, control bytes, non-ASCII text);
# - a Mixtral that transformers made and saved (random weights) is imported (moe import hf), trains here at
#   tp 2 x ep 2, and its logits, language-model loss (within 1e-5) and greedy generation agree with transformers';
#   so do those of a Qwen2-MoE transformers made (a dense layer, a shared expert whose gate is zero), of a Glm4-MoE
#   (a dense first layer, a shared expert, a random balancing bias), and of a dense
#   Llama upcycled into the tp 2 x ep 2 run's MoE model (--upcycle: its function unchanged).
# When the environment cannot be made (no network) the test fails, unless MOE_TEST_OFFLINE=1 says this machine
# is offline: then it is skipped (exit 77).
#
# Usage: test_hf_interop.sh MOE_BINARY SOURCE_DIR VENV
set -eu

source "$(dirname "$0")/pinned_venv.sh"
venv_test_start moe_hf_interop tests/requirements-hf.txt transformers --no-deps -- "$@"
small=(--set train.steps=4 --set model.d_model=32 --set model.layers=2 --set model.heads=2 --set model.ffn_hidden=32
  --set moe.num_experts=4 --set moe.expert_hidden=32 --set train.seq_len=64 --set train.global_batch=4
  --set train.micro_batch=1 --set train.eval_sequences=2 --set train.threads=1 --set checkpoint.every=2 --quiet)
mpirun=(mpirun --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 --timeout 300)
[ "$(id -u)" = 0 ] && mpirun+=(--allow-run-as-root)
"${mpirun[@]}" -np 4 "$moe" train --config "$config" "${small[@]}" --set parallel.tp=2 --set parallel.ep=2 \
  --set moe.router.tau=0.7 --run-dir tp2ep2 > /dev/null
"${mpirun[@]}" -np 4 "$moe" train --config "$config" "${small[@]}" --set parallel.pp=2 --set parallel.ep=2 \
  --set checkpoint.full_every=2 --set moe.router.tau_learned=true --set moe.router.tau=0.8 --set moe.overflow=dense \
  --set moe.fallback_hidden=16 --run-dir pp2ep2 > /dev/null

# Qwen2-MoE: a dense layer (moe.every 2), a shared expert, unnormalised gates, tau 0.9, at tp 2 x ep 2; and one
# without shared experts (the shared expert of width 0) at pp 2.
"${mpirun[@]}" -np 4 "$moe" train --config "$config" "${small[@]}" --set parallel.tp=2 --set parallel.ep=2 \
  --set model.ffn_hidden=48 --set moe.every=2 --set moe.shared_experts=1 --set moe.router.normalize=false \
  --set moe.router.tau=0.9 --run-dir qwen > /dev/null
"${mpirun[@]}" -np 2 "$moe" train --config "$config" "${small[@]}" --set parallel.pp=2 --set moe.router.normalize=false \
  --run-dir qwen-unshared > /dev/null
# Glm4-MoE (DeepSeek-V3's MoE block): sigmoid scores with a learned balancing bias (e_score_correction_bias), a
# dense first layer, a shared expert, tau 0.9, at tp 2 x ep 2; and top-1 (the gate the score itself) at pp 2 x ep 2.
"${mpirun[@]}" -np 4 "$moe" train --config "$config" "${small[@]}" --set parallel.tp=2 --set parallel.ep=2 \
  --set model.ffn_hidden=48 --set moe.every=2 --set moe.shared_experts=1 --set moe.router.score=sigmoid \
  --set moe.router.bias_balance.rate=0.05 --set moe.router.bias_balance.rule=proportional --set moe.router.tau=0.9 \
  --run-dir glm > /dev/null
"${mpirun[@]}" -np 4 "$moe" train --config "$config" "${small[@]}" --set parallel.pp=2 --set parallel.ep=2 --set moe.top_k=1 \
  --set moe.router.score=sigmoid --set moe.router.bias_balance.rate=0.05 --set moe.router.bias_balance.rule=proportional \
  --run-dir glm-top1 > /dev/null
"$moe" prep --input "$src/data/corpus/prose.txt" --out prepared --tokenizer train --vocab 320 > /dev/null
"${mpirun[@]}" -np 2 "$moe" train --config "$config" "${small[@]}" --set parallel.ep=2 --set model.vocab=320 \
  --set 'data.sources=[{"name": "prose", "path": "prepared"}]' --run-dir bpe > /dev/null

# Held-out text (the end of a corpus file, which data.heldout_fraction keeps out of training) for the logits, a
# longer sample for the tokenizer: corpus text, non-ASCII text, runs of letters, digits, punctuation and white
# space longer than a BPE chunk (64 bytes), control bytes.
tail -n 1 "$src/data/corpus/prose.txt" | head -c 24 > prompt.txt
long() { printf "$1%.0s" $(seq "$2"); }
{
  tail -c 2000 "$src/data/corpus/prose.txt"
  tail -c 600 "$src/data/corpus/code.txt"
  printf 'Ünïcödé, ☃ and 😀\n\ttabs  and  spaces\r\n'
  long a 70; printf ' '; long b 130; long ' ' 70; printf 'x'; long 1234567890 8; long '!' 90; printf '\n\n\n  \n x'
  long ' ' 65; printf 'y \t z\001\002 ctl \177 end '; long w 64; printf '  '
} > sample.txt

check() { # RUN_DIR EXPORT_DIR [--bf16]
  "$moe" logits "$1" --text-file prompt.txt --generate 32 --out "$2.json" 2> /dev/null
  "$moe" logits "$1" --text-file sample.txt --out "$2.sample.json" 2> /dev/null
  "$venv/bin/python" "$src/tests/cli/check_hf_interop.py" "$2" "$2.json" sample.txt "$2.sample.json" "${@:3}"
}
# Several safetensors files (a layer's experts are 4 * 3 * 4 KiB): the index sends transformers to each.
"$moe" export hf tp2ep2 --out tp2ep2-hf --max-shard-size 40KiB > /dev/null
ls tp2ep2-hf/model-00001-of-0000[3-9].safetensors > /dev/null
check tp2ep2 tp2ep2-hf
"$moe" export hf pp2ep2 --out pp2ep2-hf > /dev/null
check pp2ep2 pp2ep2-hf
"$moe" export hf pp2ep2 --out pp2ep2-bf16 --dtype bf16 > /dev/null
check pp2ep2 pp2ep2-bf16 --bf16
"$moe" export hf bpe --out bpe-hf > /dev/null
check bpe bpe-hf
"$moe" export hf qwen --out qwen-hf > /dev/null
check qwen qwen-hf
"$moe" export hf qwen-unshared --out qwen-unshared-hf > /dev/null
check qwen-unshared qwen-unshared-hf
"$moe" export hf glm --out glm-hf > /dev/null
grep -q '"Glm4MoeForCausalLM"' glm-hf/config.json
check glm glm-hf
"$moe" export hf glm-top1 --out glm-top1-hf > /dev/null
# The bias is learned (the proportional rule: the sign rule's +-rate steps can cancel to 0 in a few steps), so
# the selection by score + bias is what is compared.
for dir in glm-hf glm-top1-hf; do
  "$venv/bin/python" -c "
import sys, torch
from safetensors.torch import load_file
import json, os
d = sys.argv[1]
files = set(json.load(open(os.path.join(d, 'model.safetensors.index.json')))['weight_map'].values())
biases = [t for f in files for n, t in load_file(os.path.join(d, f)).items() if n.endswith('e_score_correction_bias')]
assert biases and all(b.abs().max() > 0 for b in biases), biases" "$dir"
done
check glm-top1 glm-top1-hf

# A Mixtral that transformers itself made (random weights, saved as one model.safetensors), imported with the
# tp 2 x ep 2 run's config (tau 0.7 folded back into the router), trained on from there at tp 2 x ep 2, and its
# logits, loss and greedy generation from the import against transformers'.
"$venv/bin/python" - << 'PY'
import torch
from transformers import MixtralConfig, MixtralForCausalLM
torch.manual_seed(7)
config = MixtralConfig(vocab_size=256, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                       num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
                       rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                       tie_word_embeddings=False)
model = MixtralForCausalLM(config)
with torch.no_grad():  # weights of the size training gives, so that routing and logits are not all alike
    for p in model.parameters():
        if p.dim() > 1:
            p.normal_(0, 0.3)
model.save_pretrained("made-by-transformers")
# A Qwen2-MoE of the qwen run's shape; its shared expert's gate zero (what this project's ungated shared experts are).
from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM
config = Qwen2MoeConfig(vocab_size=256, hidden_size=32, intermediate_size=48, moe_intermediate_size=32,
                        shared_expert_intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                        num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, decoder_sparse_step=2,
                        norm_topk_prob=False, qkv_bias=False, max_position_embeddings=64, rms_norm_eps=1e-5,
                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False)
model = Qwen2MoeForCausalLM(config)
with torch.no_grad():
    for name, p in model.named_parameters():
        if p.dim() > 1:
            p.normal_(0, 0.3)
    model.model.layers[1].mlp.shared_expert_gate.weight.zero_()
model.save_pretrained("qwen-made-by-transformers")
# A Glm4-MoE of the glm run's shape (a dense first layer, a shared expert), with a random balancing bias.
from transformers import Glm4MoeConfig, Glm4MoeForCausalLM
config = Glm4MoeConfig(vocab_size=256, hidden_size=32, intermediate_size=48, moe_intermediate_size=32,
                       num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, head_dim=16,
                       n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1,
                       norm_topk_prob=True, n_group=1, topk_group=1, routed_scaling_factor=1.0, use_qk_norm=False,
                       max_position_embeddings=64, rms_norm_eps=1e-5, num_nextn_predict_layers=0,
                       partial_rotary_factor=1.0,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0},
                       tie_word_embeddings=False)
model = Glm4MoeForCausalLM(config)
with torch.no_grad():
    for name, p in model.named_parameters():
        if p.dim() > 1:
            p.normal_(0, 0.3)
    model.model.layers[1].mlp.gate.e_score_correction_bias.normal_(0, 0.3)
model.save_pretrained("glm-made-by-transformers")
# A dense Llama of the same width, to upcycle.
from transformers import LlamaConfig, LlamaForCausalLM
config = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                     num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False)
model = LlamaForCausalLM(config)
with torch.no_grad():
    for p in model.parameters():
        if p.dim() > 1:
            p.normal_(0, 0.3)
model.save_pretrained("llama-made-by-transformers")
PY
"$moe" import hf made-by-transformers --config tp2ep2/config.json --out imported > /dev/null
"$moe" logits imported --text-file prompt.txt --generate 32 --out imported.json 2> /dev/null
"$venv/bin/python" "$src/tests/cli/check_hf_interop.py" made-by-transformers imported.json - -
"${mpirun[@]}" -np 4 "$moe" train --config tp2ep2/config.json --run-dir imported --set train.steps=2 --quiet \
  > /dev/null
grep -q '"step":2' imported/metrics.jsonl || { echo "FAIL: the imported run did not train" >&2; exit 1; }
"$moe" import hf qwen-made-by-transformers --config qwen/config.json --out qwen-imported > /dev/null
"$moe" logits qwen-imported --text-file prompt.txt --generate 32 --out qwen-imported.json 2> /dev/null
"$venv/bin/python" "$src/tests/cli/check_hf_interop.py" qwen-made-by-transformers qwen-imported.json - -
"$moe" import hf glm-made-by-transformers --config glm/config.json --out glm-imported > /dev/null
"$moe" logits glm-imported --text-file prompt.txt --generate 32 --out glm-imported.json 2> /dev/null
"$venv/bin/python" "$src/tests/cli/check_hf_interop.py" glm-made-by-transformers glm-imported.json - -
# Upcycled: every expert the layer's MLP and the gates renormalised to sum 1, so the MoE model computes the dense
# Llama's function whatever the (freshly initialised) router chooses.
"$moe" import hf llama-made-by-transformers --upcycle --config tp2ep2/config.json --out upcycled > /dev/null
"$moe" logits upcycled --text-file prompt.txt --generate 32 --out upcycled.json 2> /dev/null
"$venv/bin/python" "$src/tests/cli/check_hf_interop.py" llama-made-by-transformers upcycled.json - -
# Upcycled with noise: every expert weight the dense one times (1 + 0.05 e), e standard normal, the same bits from
# the same command; read back through an export.
for i in 1 2; do
  "$moe" import hf llama-made-by-transformers --upcycle --upcycle-noise 0.05 --config tp2ep2/config.json \
    --out "noisy$i" > /dev/null
  "$moe" export hf "noisy$i" --out "noisy$i-hf" > /dev/null
done
diff -r noisy1-hf noisy2-hf > /dev/null || { echo "FAIL: upcycle noise not reproducible" >&2; exit 1; }
"$venv/bin/python" - <<'PY' || exit 1
import glob, sys
from safetensors.numpy import load_file
def tensors(d): return {k: v for f in sorted(glob.glob(d + "/*.safetensors")) for k, v in load_file(f).items()}
dense, noisy = tensors("llama-made-by-transformers"), tensors("noisy1-hf")
for layer in range(2):
    w = dense[f"model.layers.{layer}.mlp.gate_proj.weight"]
    experts = [noisy[f"model.layers.{layer}.block_sparse_moe.experts.{e}.w1.weight"] for e in range(4)]
    for e, x in enumerate(experts):
        ratio = x / w - 1
        if not (0.045 < ratio.std() < 0.055 and abs(ratio.mean()) < 0.01):
            sys.exit(f"FAIL: layer {layer} expert {e}: x / w - 1 has mean {ratio.mean()} std {ratio.std()}, not ~N(0, 0.05)")
    if any((experts[a] == experts[b]).all() for a in range(4) for b in range(a)):
        sys.exit(f"FAIL: layer {layer}: two upcycled experts are equal despite the noise")
print("ok: upcycle noise: each expert weight w (1 + 0.05 e), the experts differ")
PY
echo "ok: exports loaded by transformers agree with moe logits"
