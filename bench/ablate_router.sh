#!/usr/bin/env bash
# Router ablations on the embedded default: dense vs MoE at equal active compute, balancing terms off /
# aux loss / balancing bias (load evenness, cv), router temperature (routing entropy), capacity factor
# (drops), and the routing techniques of docs/moe.md (overflow cascade, scheduled and learned temperature,
# adaptive capacity, router warm-up, proportional bias, frequency-aware clipping) and latent attention,
# each beside the default (moe_aux). Trains each variant of configs/tiny_moe.json and prints one summary
# line per run. Figures are means over the last quarter of the logged steps; eval_loss is the final held-out
# loss; overflow% is the share of assignments over capacity (dropped, rerouted or sent to the fallback);
# cf and tau are the last step's capacity factor and temperature (first MoE layer).
# Usage: bench/ablate_router.sh [OUT_DIR] [extra --set arguments...]   (needs python3 for the summary)
# ARMS="moe_aux cascade ..." runs only those arms; JOBS=N runs N at once (one thread each, then); MOE=path
# the program (default build/bin/moe).
set -euo pipefail
cd "$(dirname "$0")/.."
moe=${MOE:-build/bin/moe}  # MOE=path/to/moe for another build directory
out=${1:-runs/ablate}
shift || true
mkdir -p "$out"
extra=("$@")
jobs=${JOBS:-1}
threads=()
if [ "$jobs" -gt 1 ]; then threads=(--set train.threads=1); fi

# name config [--set ...]: one arm.
arms=()
arm() { arms+=("$(printf "%q " "$@")"); }
arm dense configs/tiny.json
arm moe_aux configs/tiny_moe.json
arm moe_no_balance configs/tiny_moe.json --set moe.loss.aux=0 --set moe.loss.z=0
arm moe_bias configs/tiny_moe.json --set moe.loss.aux=0 --set moe.router.bias_balance.rate=0.005
arm tau_0.5 configs/tiny_moe.json --set moe.router.tau=0.5
arm tau_2.0 configs/tiny_moe.json --set moe.router.tau=2.0
arm cf_0.5 configs/tiny_moe.json --set moe.capacity_factor=0.5
arm cf_1.0 configs/tiny_moe.json --set moe.capacity_factor=1.0
arm cf_2.0 configs/tiny_moe.json --set moe.capacity_factor=2.0
arm dropless configs/tiny_moe.json --set moe.capacity_factor=0
# The routing techniques of docs/moe.md, one at a time.
arm reroute configs/tiny_moe.json --set moe.overflow=reroute
arm cascade configs/tiny_moe.json --set 'moe.overflow=["reroute","dense"]'
# At capacity factor 1.25 rerouting always finds room (capacity for 1.25 N k assignments); at 1.0 it finds it
# for most, and at 0.5 for none: the cascade's second level takes the rest.
arm reroute_cf_1.0 configs/tiny_moe.json --set moe.overflow=reroute --set moe.capacity_factor=1.0
arm cascade_cf_1.0 configs/tiny_moe.json --set 'moe.overflow=["reroute","dense"]' --set moe.capacity_factor=1.0
arm reroute_cf_0.5 configs/tiny_moe.json --set moe.overflow=reroute --set moe.capacity_factor=0.5
arm cascade_cf_0.5 configs/tiny_moe.json --set 'moe.overflow=["reroute","dense"]' --set moe.capacity_factor=0.5
arm tau_schedule configs/tiny_moe.json --set 'moe.router.tau_schedule=[{"step":0,"tau":1.0},{"step":300,"tau":0.5}]'
arm tau_learned configs/tiny_moe.json --set moe.router.tau_learned=true
arm capacity_auto configs/tiny_moe.json --set moe.capacity_auto.enabled=true
arm warmup configs/tiny_moe.json --set moe.router.warmup.steps=30
arm warmup_frozen configs/tiny_moe.json --set moe.router.warmup.steps=30 --set moe.router.warmup.freeze_backbone=true
arm bias_proportional configs/tiny_moe.json --set moe.loss.aux=0 --set moe.router.bias_balance.rate=0.005 \
  --set moe.router.bias_balance.rule=proportional
arm clip configs/tiny_moe.json --set optim.per_expert_clip=2.5
arm clip_hot configs/tiny_moe.json --set optim.per_expert_clip=2.5 --set optim.per_expert_clip_hot=0.5
arm mla configs/tiny_moe.json --set model.attention=mla

run() {  # name config [--set ...]
  local name=$1 config=$2
  shift 2
  "$moe" train --config "$config" --run-dir "$out/$name" --overwrite --quiet "$@" "${threads[@]}" "${extra[@]}"
}
running=0
for spec in "${arms[@]}"; do
  eval "set -- $spec"
  if [ -n "${ARMS:-}" ] && [[ " $ARMS " != *" $1 "* ]]; then continue; fi
  run "$@" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
done
wait

python3 - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
print(f"{'run':<18}{'eval_loss':>10}{'lm_loss':>9}{'cv':>7}{'entropy':>9}{'dropped%':>9}{'overflow%':>10}{'cf':>6}{'tau':>6}{'tok/s':>8}")
for run in sorted(p for p in out.iterdir() if (p / "metrics.jsonl").exists()):
    lines = [json.loads(l) for l in open(run / "metrics.jsonl")]
    train = [l for l in lines if "lm_loss" in l]
    evals = [l for l in lines if "eval_loss" in l]
    tail = train[-max(1, len(train) // 4):]
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")
    cv = mean([mean([m["cv"] for m in l["moe"]]) for l in tail if l["moe"]])
    ent = mean([mean([m["entropy"] for m in l["moe"]]) for l in tail if l["moe"]])
    routed = lambda m: sum(m["tokens_per_expert"]) + m["dropped"] + m.get("fallback", 0)
    drop = mean([sum(m["dropped"] for m in l["moe"]) / max(1, sum(routed(m) for m in l["moe"])) for l in tail if l["moe"]])
    over = mean([mean([m.get("overflow_ratio", float("nan")) for m in l["moe"]]) for l in tail if l["moe"]])
    last = train[-1]["moe"][0] if train and train[-1]["moe"] else {}
    tps = sorted(l["tokens_per_s"] for l in train[1:])[len(train[1:]) // 2] if len(train) > 1 else float("nan")
    print(f"{run.name:<18}{evals[-1]['eval_loss']:>10.4f}{mean([l['lm_loss'] for l in tail]):>9.4f}{cv:>7.3f}{ent:>9.3f}"
          f"{100*drop:>9.2f}{100*over:>10.2f}{last.get('capacity_factor', float('nan')):>6.2f}"
          f"{last.get('tau', float('nan')):>6.2f}{tps:>8.0f}")
PY
