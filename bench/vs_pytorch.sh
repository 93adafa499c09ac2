#!/usr/bin/env bash
# The peer side by side: `moe train` and the same network written plainly in PyTorch eager
# (bench/vs_pytorch.py) train on the same tokens with the same hyper-parameters (configs/bench_moe_peer.json),
# on this machine in the same minutes, with 1 and 2 threads. The runs are interleaved (ours 1t, torch 1t, ours
# 2t, torch 2t, then again) so that both sides share the machine's noise. Prints per side and thread count
# the median tokens/s of full training steps (forward, backward, AdamW), the ratio of ours to PyTorch, and the
# language-model loss of both at a few steps; the last line is one JSON object. It measures; it asserts
# nothing about speed. See docs/bench.md ("Against PyTorch").
#
# Usage: bench/vs_pytorch.sh [--quick] [BUILD_DIR] [OUT_DIR]
#   BUILD_DIR: where bin/moe and bin/bench_tokens are (default $MOE_BUILD_DIR, else build); OUT_DIR: the run
#   directories and results.jsonl (default: a temporary folder, removed at the end).
#   --quick: 3 steps on 1 thread, once: a smoke check (ctest vs_pytorch_quick, label bench), not a measurement.
#   VS_PYTORCH_STEPS (40), VS_PYTORCH_WARMUP (5: steps left out of each run's median), VS_PYTORCH_REPS (3),
#   VS_PYTORCH_THREADS ("1 2"), PYTHON (the interpreter that has torch; default: python3, else /usr/bin/python3).
# Without an importable torch it says so and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
if [[ ${1:-} == --quick ]]; then
  quick=1
  shift
fi
build=${1:-${MOE_BUILD_DIR:-build}}
out=${2:-}
config=configs/bench_moe_peer.json
steps=${VS_PYTORCH_STEPS:-40}
warmup=${VS_PYTORCH_WARMUP:-5}
reps=${VS_PYTORCH_REPS:-3}
threads=${VS_PYTORCH_THREADS:-1 2}
if ((quick)); then
  steps=3 warmup=1 reps=1 threads=1
fi
moe=$build/bin/moe
dump=$build/bin/bench_tokens
for exe in "$moe" "$dump"; do
  [[ -x $exe ]] || { echo "vs_pytorch: $exe not found; build it (cmake --build $build) or pass BUILD_DIR" >&2; exit 2; }
done
((steps > warmup)) || { echo "vs_pytorch: VS_PYTORCH_STEPS=$steps must exceed VS_PYTORCH_WARMUP=$warmup" >&2; exit 2; }

# The first interpreter that imports torch (Debian's python3-torch is for /usr/bin/python3, which a pyenv or
# virtual environment python3 first in PATH does not see).
python=
for candidate in ${PYTHON:-python3 /usr/bin/python3}; do
  if command -v "$candidate" >/dev/null && "$candidate" bench/vs_pytorch.py check >/dev/null 2>&1; then
    python=$candidate
    break
  fi
done
if [[ -z $python ]]; then
  echo "vs_pytorch: skipped: torch is not importable by ${PYTHON:-python3 or /usr/bin/python3}" \
    "(Debian: apt-get install python3-torch)"
  exit 0
fi

if [[ -z $out ]]; then
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
mkdir -p "$out"
results=$out/results.jsonl
: >"$results"
tokens_per_step=$("$python" -c "import json, sys; t = json.load(open(sys.argv[1]))['train']
print(t['global_batch'] * t['seq_len'])" "$config")

"$dump" --config "$config" --steps "$steps" --out "$out/tokens.bin" >/dev/null

ours() {  # threads rep
  local dir=$out/ours_t$1_r$2
  "$python" bench/vs_pytorch.py ours --threads "$1" --warmup "$warmup" --tokens-per-step "$tokens_per_step" "$dir" \
    -- "$moe" train --config "$config" --run-dir "$dir" --overwrite --quiet --set train.steps="$steps" \
    --set train.threads="$1" >>"$results"
}

pytorch() {  # threads: OpenBLAS and OpenMP of torch limited to it as well
  OMP_NUM_THREADS=$1 OPENBLAS_NUM_THREADS=$1 "$python" bench/vs_pytorch.py train "$config" "$out/tokens.bin" \
    --threads "$1" --steps "$steps" --warmup "$warmup" >>"$results"
}

load_start=$(cut -d' ' -f1 /proc/loadavg)
for ((rep = 1; rep <= reps; ++rep)); do
  for t in $threads; do
    echo "vs_pytorch: rep $rep/$reps, $t thread(s): ours, then pytorch" \
      "(load average $(cut -d' ' -f1 /proc/loadavg))" >&2
    ours "$t" "$rep"
    pytorch "$t"
  done
done
load_end=$(cut -d' ' -f1 /proc/loadavg)
echo "vs_pytorch: $config, $steps steps ($warmup warm-up) per run, $reps run(s) per side and thread count;" \
  "$(git rev-parse --short HEAD 2>/dev/null || echo '?'); load average $load_start at start, $load_end at end"
"$python" bench/vs_pytorch.py summary "$results" --tokens-per-step "$tokens_per_step" \
  --load-start "$load_start" --load-end "$load_end"
