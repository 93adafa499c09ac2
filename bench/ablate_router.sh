#!/usr/bin/env bash
# Router ablations on the embedded default: dense vs MoE at equal active compute, balancing terms off /
# aux loss / balancing bias (load evenness, cv), router temperature (routing entropy), capacity factor
# (drops). Trains each variant of configs/tiny_moe.json and prints one summary line per run. Figures are
# means over the last quarter of the logged steps; eval_loss is the final held-out loss.
# Usage: bench/ablate_router.sh [OUT_DIR] [extra --set arguments...]   (needs python3 for the summary)
set -euo pipefail
cd "$(dirname "$0")/.."
moe=build/bin/moe
out=${1:-runs/ablate}
shift || true
mkdir -p "$out"

run() {  # name config [--set ...]
  local name=$1 config=$2
  shift 2
  "$moe" train --config "$config" --run-dir "$out/$name" --overwrite --quiet "$@" "${extra[@]}"
}
extra=("$@")
run dense configs/tiny.json
run moe_aux configs/tiny_moe.json
run moe_no_balance configs/tiny_moe.json --set moe.loss.aux=0 --set moe.loss.z=0
run moe_bias configs/tiny_moe.json --set moe.loss.aux=0 --set moe.router.bias_balance.rate=0.005
run tau_0.5 configs/tiny_moe.json --set moe.router.tau=0.5
run tau_2.0 configs/tiny_moe.json --set moe.router.tau=2.0
run cf_0.5 configs/tiny_moe.json --set moe.capacity_factor=0.5
run cf_1.0 configs/tiny_moe.json --set moe.capacity_factor=1.0
run cf_2.0 configs/tiny_moe.json --set moe.capacity_factor=2.0
run dropless configs/tiny_moe.json --set moe.capacity_factor=0

python3 - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
print(f"{'run':<16}{'eval_loss':>10}{'lm_loss':>9}{'cv':>7}{'entropy':>9}{'dropped%':>9}{'tok/s':>8}")
for run in sorted(p for p in out.iterdir() if (p / "metrics.jsonl").exists()):
    lines = [json.loads(l) for l in open(run / "metrics.jsonl")]
    train = [l for l in lines if "lm_loss" in l]
    evals = [l for l in lines if "eval_loss" in l]
    tail = train[-max(1, len(train) // 4):]
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")
    cv = mean([mean([m["cv"] for m in l["moe"]]) for l in tail if l["moe"]])
    ent = mean([mean([m["entropy"] for m in l["moe"]]) for l in tail if l["moe"]])
    drop = mean([sum(m["dropped"] for m in l["moe"]) / max(1, sum(sum(m["tokens_per_expert"]) + m["dropped"] for m in l["moe"])) for l in tail if l["moe"]])
    tps = sorted(l["tokens_per_s"] for l in train[1:])[len(train[1:]) // 2] if len(train) > 1 else float("nan")
    print(f"{run.name:<16}{evals[-1]['eval_loss']:>10.4f}{mean([l['lm_loss'] for l in tail]):>9.4f}{cv:>7.3f}{ent:>9.3f}{100*drop:>9.2f}{tps:>8.0f}")
PY
