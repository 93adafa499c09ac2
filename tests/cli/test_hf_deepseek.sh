#!/usr/bin/env bash
# DeepseekV3ForCausalLM through transformers itself (installed as for test_hf_interop.sh, pinned by
# tests/requirements-hf.txt into VENV):
# - a small model of latent attention with its latents' norms (model.mla.norms) and DeepSeek-V3's MoE block (sigmoid
#   scores with a learned balancing bias, a dense first layer, a shared expert, tau 0.9) trained a few steps at
#   pp 2 x ep 2 is exported; AutoModelForCausalLM loads a DeepseekV3ForCausalLM whose logits on held-out text agree
#   with `moe logits` (fp32: max relative difference <= 1e-4, KL <= 1e-8), whose language-model loss agrees within
#   1e-5, and whose greedy generation of 32 tokens is the same; the byte tokenizer round-trips a sample; the bf16
#   export agrees within bf16's rounding;
# - a DeepSeek-V3 that transformers made and saved (random weights, norms' gains and balancing bias) is imported
#   (moe import hf), its logits, loss (within 1e-5) and greedy generation agree with transformers', and it trains on
#   here at pp 2 x ep 2; one without a query latent (q_lora_rank null) imported as model.mla.q_rank = 0 and
#   exported again agrees with transformers' too.
# When the environment cannot be made (no network) the test fails, unless MOE_TEST_OFFLINE=1 says this machine is
# offline: then it is skipped (exit 77).
#
# Usage: test_hf_deepseek.sh MOE_BINARY SOURCE_DIR VENV
set -eu

source "$(dirname "$0")/pinned_venv.sh"
venv_test_start moe_hf_deepseek tests/requirements-hf.txt transformers --no-deps -- "$@"
small=(--set train.steps=4 --set model.d_model=32 --set model.layers=2 --set model.heads=2 --set model.ffn_hidden=48
  --set moe.num_experts=4 --set moe.expert_hidden=32 --set train.seq_len=64 --set train.global_batch=4
  --set train.micro_batch=1 --set train.eval_sequences=2 --set train.threads=1 --set checkpoint.every=2 --quiet
  --set model.attention=mla --set model.mla.norms=true --set model.mla.kv_rank=8 --set model.mla.q_rank=12
  --set model.mla.rope_dim=4 --set moe.every=2 --set moe.shared_experts=1 --set moe.router.score=sigmoid
  --set moe.router.bias_balance.rate=0.05 --set moe.router.bias_balance.rule=proportional)
mpirun=(mpirun --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 --timeout 300)
[ "$(id -u)" = 0 ] && mpirun+=(--allow-run-as-root)
"${mpirun[@]}" -np 4 "$moe" train --config "$config" "${small[@]}" --set parallel.pp=2 --set parallel.ep=2 \
  --set moe.router.tau=0.9 --run-dir dsv3 > /dev/null

tail -n 1 "$src/data/corpus/prose.txt" | head -c 24 > prompt.txt
tail -c 1500 "$src/data/corpus/prose.txt" > sample.txt
"$moe" logits dsv3 --text-file prompt.txt --generate 32 --out dsv3.json 2> /dev/null
"$moe" logits dsv3 --text-file sample.txt --out dsv3.sample.json 2> /dev/null
"$moe" export hf dsv3 --out dsv3-hf > /dev/null
grep -q '"DeepseekV3ForCausalLM"' dsv3-hf/config.json
"$venv/bin/python" "$src/tests/cli/check_hf_interop.py" dsv3-hf dsv3.json sample.txt dsv3.sample.json
"$moe" export hf dsv3 --out dsv3-bf16 --dtype bf16 > /dev/null
"$venv/bin/python" "$src/tests/cli/check_hf_interop.py" dsv3-bf16 dsv3.json sample.txt dsv3.sample.json --bf16

# A DeepSeek-V3 of the run's shape that transformers made: random weights, gains of the four norms of a layer away
# from 1, a random balancing bias.
"$venv/bin/python" - << 'PY'
import torch
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
torch.manual_seed(11)
config = DeepseekV3Config(vocab_size=256, hidden_size=32, intermediate_size=48, moe_intermediate_size=32,
                          num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, n_routed_experts=4,
                          n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1, norm_topk_prob=True,
                          n_group=1, topk_group=1, routed_scaling_factor=1.0, kv_lora_rank=8, q_lora_rank=12,
                          qk_rope_head_dim=4, qk_nope_head_dim=16, v_head_dim=16, rope_interleave=True,
                          max_position_embeddings=64, rms_norm_eps=1e-5, num_nextn_predict_layers=0,
                          rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False,
                          attention_bias=False)

def save(config, where):
    model = DeepseekV3ForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
            elif name.endswith("norm.weight"):
                p.normal_(1, 0.2)
        model.model.layers[1].mlp.gate.e_score_correction_bias.normal_(0, 0.3)
    model.save_pretrained(where)

save(config, "made-by-transformers")
config.q_lora_rank = None  # DeepSeek-V2-Lite's queries: q_proj from the hidden state, no query latent
save(config, "made-direct")
PY
"$moe" import hf made-by-transformers --config dsv3/config.json --out imported > /dev/null
"$moe" logits imported --text-file prompt.txt --generate 32 --out imported.json 2> /dev/null
"$venv/bin/python" "$src/tests/cli/check_hf_interop.py" made-by-transformers imported.json - -
"${mpirun[@]}" -np 4 "$moe" train --config dsv3/config.json --run-dir imported --set train.steps=2 --quiet > /dev/null
grep -q '"step":2' imported/metrics.jsonl || { echo "FAIL: the imported run did not train" >&2; exit 1; }
# Queries without a latent (q_lora_rank null) are model.mla.q_rank = 0: imported, the same logits, loss and
# generation as transformers'; exported again (q_proj, no q_a_proj), loaded by transformers, the same again.
"$moe" import hf made-direct --config dsv3/config.json --set model.mla.q_rank=0 --out direct > /dev/null
"$moe" logits direct --text-file prompt.txt --generate 32 --out direct.json 2> /dev/null
"$venv/bin/python" "$src/tests/cli/check_hf_interop.py" made-direct direct.json - -
"$moe" export hf direct --out direct-hf > /dev/null
grep -q '"q_lora_rank": null' direct-hf/config.json || { echo "FAIL: q_lora_rank not null" >&2; exit 1; }
"$venv/bin/python" "$src/tests/cli/check_hf_interop.py" direct-hf direct.json - -
echo "ok: DeepSeek-V3 exports loaded by transformers agree with moe logits; its models import"
