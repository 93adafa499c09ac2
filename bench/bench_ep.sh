#!/usr/bin/env bash
# The exposed expert all-to-all of `moe train` with expert parallelism, before and after the overlap: trains
# configs/tiny_moe.json with parallel.ep = 2 on 2 ranks (dp 1) and on 4 ranks (dp 2), with the all-to-all
# blocking (parallel.ep_overlap = false, "before") and overlapped with the shared experts and the dense
# fallback (true, "after"), and prints per run the median step time, the median exposed all-to-all time per
# step (metrics.jsonl a2a_wait_s: rank 0's seconds held up in the counts' exchange and in starting and
# waiting for the rows, forward and backward, every MoE layer and micro-batch) and its median share of the
# step, and how many cores other processes took meanwhile (a run they disturbed is not comparable). Each
# pair of runs is repeated MOE_EP_REPEATS times, before and after interleaved, so that drifting load hits
# both. The last line is one JSON object with every figure. It measures; it asserts nothing about speed.
# See docs/bench.md ("Expert all-to-all").
#
# Usage: bench/bench_ep.sh [BUILD_DIR] [OUT_DIR]
#   BUILD_DIR: where bin/moe is (default $MOE_BUILD_DIR, else build); OUT_DIR: run directories (default
#   runs/ep; overwritten). MOE_EP_STEPS: steps per run (30); MOE_EP_REPEATS: repeats of each pair (3);
#   MOE_EP_SET="key=value ...": extra --set for every run (default moe.shared_experts=1: something to
#   overlap; the overlap hides nothing without shared experts or a dense fallback).
# Needs mpirun (OpenMPI) and python3. About 2 minutes on 2 idle cores.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-${MOE_BUILD_DIR:-build}}
out=${2:-runs/ep}
moe=$build/bin/moe
steps=${MOE_EP_STEPS:-30}
repeats=${MOE_EP_REPEATS:-3}
[[ -x $moe ]] || { echo "bench_ep: $moe not found; build it (cmake --build $build --target moe) or pass BUILD_DIR" >&2; exit 2; }
(( steps > 5 )) || { echo "bench_ep: MOE_EP_STEPS=$steps: expected more than 5 (the first 5 steps are not measured)" >&2; exit 2; }
(( repeats >= 1 )) || { echo "bench_ep: MOE_EP_REPEATS=$repeats: expected at least 1" >&2; exit 2; }
command -v python3 >/dev/null || { echo "bench_ep: python3 is needed for the summary" >&2; exit 2; }
mkdir -p "$out"

# The flags of tests/CMakeLists.txt (docs/design.md "Small machines").
mpirun_flags=(--oversubscribe --bind-to none --mca mpi_yield_when_idle 1 --timeout 300)
[[ $(id -u) == 0 ]] && mpirun_flags+=(--allow-run-as-root)

# log_every 1: a2a_wait_s and tokens_per_s of every step (tokens_per_s over one step: its time).
common=(--config configs/tiny_moe.json --overwrite --quiet --set train.steps="$steps" --set train.log_every=1
        --set train.eval_every=0 --set train.eval_sequences=1 --set train.threads=1 --set parallel.ep=2)
for kv in ${MOE_EP_SET:-moe.shared_experts=1}; do common+=(--set "$kv"); done

# Runs a command and writes to $out/$name/cpu.json its wall time, its processes' CPU seconds and the whole
# machine's busy CPU seconds (/proc/stat): the difference is what other users took (as bench_scaling.sh).
timed() {  # name command...
  local name=$1
  shift
  python3 - "$out/$name/cpu.json" "$@" <<'PY'
import json, os, subprocess, sys, time
def busy():  # user + nice + system + irq + softirq + steal, all cores, in seconds
    f = open("/proc/stat").readline().split()
    return sum(int(x) for x in (f[1], f[2], f[3], f[6], f[7], f[8])) / os.sysconf("SC_CLK_TCK")
b0, w0 = busy(), time.monotonic()
rc = subprocess.run(sys.argv[2:]).returncode
wall, machine = time.monotonic() - w0, busy() - b0
t = os.times()
if rc == 0:
    json.dump({"wall_s": wall, "own_cpu_s": t.children_user + t.children_system, "machine_cpu_s": machine},
              open(sys.argv[1], "w"))
sys.exit(rc)
PY
}

run() {  # name ranks overlap
  local name=$1 ranks=$2 overlap=$3
  echo "bench_ep: $name ($ranks ranks, ep_overlap $overlap), load average $(cut -d' ' -f1 /proc/loadavg)" >&2
  mkdir -p "$out/$name"
  timed "$name" mpirun -np "$ranks" "${mpirun_flags[@]}" "$moe" train "${common[@]}" --run-dir "$out/$name" \
    --set parallel.ep_overlap="$overlap"
}

load_start=$(cut -d' ' -f1 /proc/loadavg)
runs=()
for ((i = 1; i <= repeats; ++i)); do
  for layout in "r2_ep2 2" "r4_dp2_ep2 4"; do
    read -r name ranks <<<"$layout"
    for overlap in false true; do
      tag=$([[ $overlap == true ]] && echo after || echo before)
      run "${name}_${tag}_$i" "$ranks" "$overlap"
      runs+=("${name}_${tag}_$i")
    done
  done
done
load_end=$(cut -d' ' -f1 /proc/loadavg)

python3 - "$out" "$(nproc)" "$load_start" "$load_end" "${runs[@]}" <<'PY'
import json, pathlib, statistics, sys

out, cores, load_start, load_end, names = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]
SKIP = 5  # the first steps start threads, touch memory and fill caches (the script checks steps > SKIP)

def steps_of(name):
    d = out / name
    config = json.load(open(d / "config.json"))
    tokens_per_step = config["train"]["global_batch"] * config["train"]["seq_len"]
    lines = [json.loads(l) for l in open(d / "metrics.jsonl")]
    train = [l for l in lines if "tokens_per_s" in l and l["step"] > SKIP]
    cpu = json.load(open(d / "cpu.json"))
    others = max(0.0, cpu["machine_cpu_s"] - cpu["own_cpu_s"]) / cpu["wall_s"]
    # step time = tokens / (tokens/s) of a one-step interval; the exposed share of each step.
    return [(tokens_per_step / l["tokens_per_s"], l["a2a_wait_s"]) for l in train], others

def medians(steps):
    return (1e3 * statistics.median(t for t, _ in steps), 1e3 * statistics.median(w for _, w in steps),
            statistics.median(w / t for t, w in steps))

per_run = []  # (name, step ms, a2a ms, share, others) of each run, in the order they ran
def summary(group):  # the steps of every repeat of one (layout, before/after)
    steps, others = [], []
    for name in group:
        s, o = steps_of(name)
        steps += s
        others.append(o)
        per_run.append((name, *medians(s), o))
    return {"runs": group, "steps_measured": len(steps),
            "step_ms": 1e3 * statistics.median(t for t, _ in steps),
            "a2a_wait_ms": 1e3 * statistics.median(w for _, w in steps),
            "a2a_share": statistics.median(w / t for t, w in steps),
            "others_cores": {"median": statistics.median(others), "max": max(others)}}

rows = []
for layout in ("r2_ep2", "r4_dp2_ep2"):
    row = {"layout": layout}
    for tag in ("before", "after"):
        row[tag] = summary([n for n in names if n.startswith(f"{layout}_{tag}_")])
    rows.append(row)
print(f"moe train, configs/tiny_moe.json, parallel.ep = 2; medians over steps {SKIP + 1}.. of every repeat; "
      f"{cores} cores; load average {load_start} at start, {load_end} at end")
print("before = parallel.ep_overlap false (blocking all-to-all), after = true; a2a = a2a_wait_s, rank 0's exposed"
      " all-to-all per step;\n  share = median over steps of a2a_wait_s / step time; others = cores other"
      " processes used (median, max over repeats)")
print(f"{'layout':<12}{'':>7}{'step ms':>9}{'a2a ms':>9}{'share%':>8}{'others':>13}")
for r in rows:
    for tag in ("before", "after"):
        s = r[tag]
        print(f"{r['layout'] if tag == 'before' else '':<12}{tag:>7}{s['step_ms']:>9.1f}{s['a2a_wait_ms']:>9.2f}"
              f"{100 * s['a2a_share']:>8.1f}{s['others_cores']['median']:>7.2f}{s['others_cores']['max']:>6.2f}")
print("each run (compare a before with the after next to it, and only when others is low for both):")
for name, step_ms, a2a_ms, share, others in sorted(per_run, key=lambda r: names.index(r[0])):
    print(f"  {name:<22}{step_ms:>9.1f}{a2a_ms:>9.2f}{100 * share:>8.1f}{others:>7.2f}")
print(json.dumps({"bench": "ep", "config": "configs/tiny_moe.json", "cores": cores, "skip_steps": SKIP,
                  "load_average_start": load_start, "load_average_end": load_end, "layouts": rows,
                  "runs": [dict(zip(("run", "step_ms", "a2a_wait_ms", "a2a_share", "others_cores"), r))
                           for r in per_run]}))
PY
