#!/usr/bin/env bash
# Exposed communication per step across hosts, on an unlimited link and on a rate-limited one: trains
# configs/tiny_moe.json at dp 4 x ep 2 on 2 simulated hosts of 2 ranks (tests/cluster/cluster.sh; ranks placed
# round-robin, so that the expert all-to-all and the gradient reduction cross hosts, over TCP), first with the links
# as they are, then with mh2's link limited both ways to MOE_LINK_RATE (tc tbf), and prints per run the median step
# time and the median exposed communication of rank 0 per step (metrics.jsonl comm_wait_s, the gradient reduction
# that backward did not hide, plus a2a_wait_s, the expert all-to-all), and the limited run's against the unlimited
# one's. The last line is one JSON object with every figure. It measures; it asserts nothing about speed. See
# docs/fault.md ("Across hosts").
#
# Usage (as root): bench/bench_cluster_link.sh [BUILD_DIR]
#   MOE_LINK_RATE: the limit (default 20mbit); MOE_LINK_STEPS: steps per run (20; the first 5 are not measured).
# About 2 minutes on 2 idle cores at 20mbit.
set -u
cd "$(dirname "$0")/.." || exit 2
source tests/cluster/cluster.sh
cluster_login "$0" "$@"
build=${1:-${MOE_BUILD_DIR:-build}}
moe=$(realpath "$build/bin/moe")
config=$(realpath configs/tiny_moe.json)
rate=${MOE_LINK_RATE:-20mbit}
steps=${MOE_LINK_STEPS:-20}
[[ -x $moe ]] || { echo "bench_cluster_link: $moe not found; build it or pass BUILD_DIR" >&2; exit 2; }
((steps > 5)) || { echo "bench_cluster_link: MOE_LINK_STEPS=$steps: expected more than 5" >&2; exit 2; }

cluster_up 2 2
out="$CLUSTER_DIR/shared"
mkdir -p "$out"
run() {  # run NAME: one training run across the hosts
  mpirun -np 4 --allow-run-as-root --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 --timeout 600 \
    --hostfile "$CLUSTER_HOSTFILE" --map-by node "$moe" train --config "$config" --quiet --set train.steps="$steps" \
    --set train.log_every=1 --set train.eval_every=0 --set train.eval_sequences=1 --set train.threads=1 \
    --set parallel.ep=2 --run-dir "$out/$1" > "$out/$1.log" 2>&1 || { cat "$out/$1.log" >&2; exit 1; }
}
run unlimited
cluster_rate mh2 "$rate"
run limited
cluster_rate mh2 off
python3 - "$out" "$rate" << 'PY'
import json, statistics, sys
out, rate = sys.argv[1], sys.argv[2]
def figures(name):
    lines = [json.loads(l) for l in open(f"{out}/{name}/metrics.jsonl") if '"tokens_per_s"' in l]
    lines = [m for m in lines if m["step"] > 5]
    tokens = 16 * 128  # global_batch x seq_len of configs/tiny_moe.json
    step = statistics.median(tokens / m["tokens_per_s"] for m in lines)
    exposed = statistics.median(m.get("comm_wait_s", 0) + m.get("a2a_wait_s", 0) for m in lines)
    return {"step_s": step, "exposed_comm_s": exposed, "exposed_share": exposed / step}
u, l = figures("unlimited"), figures("limited")
for name, f in (("unlimited", u), (f"limited to {rate}", l)):
    print(f"{name:>20}: step {f['step_s'] * 1e3:7.1f} ms, exposed communication {f['exposed_comm_s'] * 1e3:7.1f} ms "
          f"per step ({100 * f['exposed_share']:.0f}% of the step)")
print(f"limited / unlimited: step time x{l['step_s'] / u['step_s']:.2f}, exposed communication "
      f"x{l['exposed_comm_s'] / max(u['exposed_comm_s'], 1e-9):.1f}")
print(json.dumps({"rate": rate, "unlimited": u, "limited": l}))
PY
