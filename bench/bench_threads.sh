#!/usr/bin/env bash
# Threads and waiting: tokens/s of `moe train` on CONFIG at 1 thread and at 2 threads, on a quiet machine and
# with one other CPU-bound process beside it: with the defaults (the OpenMP runtime's waiting, the thread
# governor of train.adapt_threads, core/backend/cpu/thread_policy.h), without the governor, and with passive
# waiting. Each figure is the median tokens/s over the steps after the first 3 of one run; the runs
# of a round are interleaved and the round repeated ROUNDS times, and the median over rounds is reported.
# Usage: bench/bench_threads.sh [BUILD_DIR] [CONFIG] [STEPS] [ROUNDS]   (needs python3)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
config=${2:-configs/tiny_moe.json}
steps=${3:-30}
rounds=${4:-3}
out=$(mktemp -d)
busy_pid=
trap '[ -n "$busy_pid" ] && kill "$busy_pid" 2>/dev/null; rm -rf "$out"' EXIT

# tokens/s of one run: NAME THREADS ADAPT [VAR=VALUE...] (train.adapt_threads, the environment of the run)
run() {
  local name=$1 threads=$2 adapt=$3
  shift 3
  env "$@" "$build/bin/moe" train --config "$config" --set train.steps="$steps" --set train.log_every=1 \
    --set train.eval_every=0 --set train.threads="$threads" --set train.adapt_threads="$adapt" --quiet \
    --run-dir "$out/run" >/dev/null
  python3 -c '
import json, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if "\"lm_loss\"" in l]
print(sys.argv[2], statistics.median(l["tokens_per_s"] for l in lines[3:]))' "$out/run/metrics.jsonl" "$name" \
    >>"$out/results"
  rm -rf "$out/run"
}

echo "bench_threads: $config, $steps steps per run, $rounds rounds; load average $(cut -d' ' -f1 /proc/loadavg) at start"
for round in $(seq "$rounds"); do
  run quiet_1 1 true
  run quiet_2 2 true
  run quiet_2_fixed 2 false
  run quiet_2_passive 2 false OMP_WAIT_POLICY=passive
  bash -c 'while :; do :; done' &
  busy_pid=$!
  run busy_1 1 true
  run busy_2 2 true
  run busy_2_fixed 2 false
  run busy_2_passive 2 false OMP_WAIT_POLICY=passive
  kill "$busy_pid"
  wait "$busy_pid" 2>/dev/null || true
  busy_pid=
  echo "round $round done"
done

python3 - "$out/results" "$config" <<'PY'
import collections, json, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    name, value = line.split()
    runs[name].append(float(value))
m = {name: statistics.median(v) for name, v in runs.items()}
print(f"{'run':<28} {'tokens/s':>9}  (median over rounds; fixed: train.adapt_threads=false)")
for name in runs:
    print(f"{name:<28} {m[name]:9.0f}")
q1, q2 = m["quiet_1"], m["quiet_2"]
print(f"2 threads / 1 thread, quiet:                       {q2 / q1:.2f}")
print(f"busy / quiet, 2 threads, defaults:                 {m['busy_2'] / q2:.2f}")
print(f"busy / quiet, 2 threads, no governor:              {m['busy_2_fixed'] / m['quiet_2_fixed']:.2f}")
print(f"busy / quiet, 2 threads, passive, no governor:     {m['busy_2_passive'] / m['quiet_2_passive']:.2f}")
print(f"quiet, defaults / no governor:                     {q2 / m['quiet_2_fixed']:.2f}")
print(f"quiet, passive / active waiting, no governor:      {m['quiet_2_passive'] / m['quiet_2_fixed']:.2f}")
print(json.dumps({"config": sys.argv[2], "tokens_per_s": m,
                  "two_over_one_thread": q2 / q1, "busy_over_quiet": m["busy_2"] / q2}))
PY
