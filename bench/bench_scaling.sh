#!/usr/bin/env bash
# Scaling of `moe train` over ranks on this machine: trains configs/tiny_moe.json for 30 steps with the same
# global batch on 1 rank (1 and 2 threads), 2 ranks (dp 2, ZeRO off and on) and 4 ranks (dp 4 with ep 2),
# one thread per rank under mpirun, and prints per run the median tokens/s, the speed-up over the 1-rank
# 1-thread run (ideal: ranks x threads, at most the machine's cores), the share of a step spent waiting
# for the gradient reduction, and how many cores other processes took meanwhile (a run they disturbed is
# not comparable). The last line is one JSON object with every figure. It measures; it asserts nothing
# about speed. See docs/bench.md ("Scaling").
#
# Usage: bench/bench_scaling.sh [BUILD_DIR] [OUT_DIR]
#   BUILD_DIR: where bin/moe is (default $MOE_BUILD_DIR, else build); OUT_DIR: run directories (default
#   runs/scaling; overwritten). MOE_SCALING_STEPS: steps per run (30); MOE_SCALING_SET="key=value ...":
#   extra --set for every run.
# Needs mpirun (OpenMPI) and python3 (the summary and the CPU accounting). About 25 s on 2 idle cores,
# over a minute on busy ones.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-${MOE_BUILD_DIR:-build}}
out=${2:-runs/scaling}
moe=$build/bin/moe
steps=${MOE_SCALING_STEPS:-30}
[[ -x $moe ]] || { echo "bench_scaling: $moe not found; build it (cmake --build $build --target moe) or pass BUILD_DIR" >&2; exit 2; }
(( steps > 5 )) || { echo "bench_scaling: MOE_SCALING_STEPS=$steps: expected more than 5 (the first 5 steps are not measured)" >&2; exit 2; }
command -v python3 >/dev/null || { echo "bench_scaling: python3 is needed for the summary" >&2; exit 2; }
mkdir -p "$out"

# The flags of tests/CMakeLists.txt (docs/design.md "Small machines"): oversubscribed ranks that yield when idle, not bound to
# cores; mpirun's timeout ends every rank if a run hangs.
mpirun_flags=(--oversubscribe --bind-to none --mca mpi_yield_when_idle 1 --timeout 300)
[[ $(id -u) == 0 ]] && mpirun_flags+=(--allow-run-as-root)

# log_every 1: tokens_per_s and comm_wait_s for every step. Evaluation only after the last step, on one
# sequence per source: its time is not in tokens_per_s, but it is in the script's runtime.
common=(--config configs/tiny_moe.json --overwrite --quiet --set train.steps="$steps" --set train.log_every=1
        --set train.eval_every=0 --set train.eval_sequences=1)
for kv in ${MOE_SCALING_SET:-}; do common+=(--set "$kv"); done

# Runs a command and writes to $out/$name/cpu.json its wall time, the CPU seconds of its processes (mpirun
# waits for its ranks, so their time is in the children's) and the busy CPU seconds of the whole machine
# (/proc/stat): the difference is what other users took from the cores during the run.
timed() {  # name command...
  local name=$1
  shift
  python3 - "$out/$name/cpu.json" "$@" <<'PY'
import json, os, subprocess, sys, time
def busy():  # user + nice + system + irq + softirq + steal (other VMs), all cores, in seconds
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

run() {  # name ranks threads [--set ...]
  local name=$1 ranks=$2 threads=$3
  shift 3
  echo "bench_scaling: $name ($ranks ranks x $threads threads), load average $(cut -d' ' -f1 /proc/loadavg)" >&2
  local cmd=("$moe" train "${common[@]}" --run-dir "$out/$name" --set train.threads="$threads" "$@")
  mkdir -p "$out/$name"
  if [[ $ranks == 1 ]]; then
    timed "$name" "${cmd[@]}"
  else
    timed "$name" mpirun -np "$ranks" "${mpirun_flags[@]}" "${cmd[@]}"
  fi
}

load_start=$(cut -d' ' -f1 /proc/loadavg)
runs=(r1_t1 r1_t2 r2_dp2 r2_dp2_zero r4_dp4_ep2)
run r1_t1 1 1
run r1_t2 1 2
run r2_dp2 2 1
run r2_dp2_zero 2 1 --set optim.zero=true
run r4_dp4_ep2 4 1 --set parallel.ep=2
load_end=$(cut -d' ' -f1 /proc/loadavg)

python3 - "$out" "$(nproc)" "$load_start" "$load_end" "${runs[@]}" <<'PY'
import json, pathlib, statistics, sys

out, cores, load_start, load_end, names = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]
SKIP = 5  # the first steps start threads, touch memory and fill caches (the script checks steps > SKIP)

def summarize(name):
    d = out / name
    manifest = json.load(open(d / "manifest.json"))
    config = json.load(open(d / "config.json"))
    lines = [json.loads(l) for l in open(d / "metrics.jsonl")]
    train = [l for l in lines if "tokens_per_s" in l and l["step"] > SKIP]
    tokens_per_step = config["train"]["global_batch"] * config["train"]["seq_len"]
    tps = [l["tokens_per_s"] for l in train]
    # Share of each step's time spent in the gradient reduction's finish(); step time = tokens / (tokens/s).
    share = [l["comm_wait_s"] / (tokens_per_step / l["tokens_per_s"]) for l in train]
    layout = manifest["layout"]
    cpu = json.load(open(d / "cpu.json"))
    others = max(0.0, cpu["machine_cpu_s"] - cpu["own_cpu_s"]) / cpu["wall_s"]
    return {"run": name, "ranks": layout["world"], "threads": manifest["threads_per_rank"], "dp": layout["dp"],
            "ep": layout["ep"], "zero": layout["zero"], "steps_measured": len(train),
            "tokens_per_step": tokens_per_step,
            "tokens_per_s": {"median": statistics.median(tps), "min": min(tps), "max": max(tps)},
            "step_ms": 1e3 * tokens_per_step / statistics.median(tps),
            "comm_wait_ms": 1e3 * statistics.median(l["comm_wait_s"] for l in train),
            "comm_share": statistics.median(share), "wall_s": cpu["wall_s"], "others_cores": others}

rows = [summarize(n) for n in names]
base = next(r for r in rows if r["ranks"] == 1 and r["threads"] == 1)["tokens_per_s"]["median"]
print(f"moe train, configs/tiny_moe.json, {rows[0]['tokens_per_step']} tokens per step (the same global batch in "
      f"every run); medians over steps {SKIP + 1}..{SKIP + rows[0]['steps_measured']}; {cores} cores; "
      f"load average {load_start} at start, {load_end} at end")
print("speed-up = tokens/s / that of 1 rank x 1 thread; ideal = min(ranks x threads, cores); comm share = median over"
      " steps of\n  comm_wait_s / step time (the wait in the gradient reduction's finish() at the end of backward);"
      " others = cores that\n  other processes used during the run, on average (above ~0.1 the run's figures are not"
      " comparable)")
print(f"{'run':<13}{'ranks':>6}{'thr':>4}{'dp':>4}{'ep':>4}{'zero':>6}{'tok/s':>9}{'(min':>7}{'max)':>7}"
      f"{'step ms':>9}{'speed-up':>9}{'ideal':>6}{'wait ms':>9}{'comm%':>7}{'others':>8}")
for r in rows:
    r["speedup"] = r["tokens_per_s"]["median"] / base
    r["ideal"] = min(r["ranks"] * r["threads"], cores)
    t = r["tokens_per_s"]
    print(f"{r['run']:<13}{r['ranks']:>6}{r['threads']:>4}{r['dp']:>4}{r['ep']:>4}{str(r['zero']).lower():>6}"
          f"{t['median']:>9.0f}{t['min']:>7.0f}{t['max']:>7.0f}{r['step_ms']:>9.1f}{r['speedup']:>9.2f}"
          f"{r['ideal']:>6}{r['comm_wait_ms']:>9.2f}{100 * r['comm_share']:>7.1f}{r['others_cores']:>8.2f}")
print(json.dumps({"bench": "scaling", "config": "configs/tiny_moe.json", "cores": cores, "skip_steps": SKIP,
                  "load_average_start": load_start, "load_average_end": load_end, "runs": rows}))
PY
