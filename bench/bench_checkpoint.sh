#!/usr/bin/env bash
# Checkpoint benchmark: the training stall of a save with the asynchronous writer on and off, the time the
# writer takes, and the size of a delta checkpoint against a full one: against the full checkpoint's files and
# against its uncompressed size (the bytes of its elements). Each figure is the median over the saves of one
# run, and stalls are given as a ratio to the median step time of a run without checkpoints measured in the
# same invocation. Usage: bench/bench_checkpoint.sh [BUILD_DIR] [CONFIG] [OUT_DIR]  (needs python3)
# With OUT_DIR the runs are kept there (bench/ckpt_filters.py OUT_DIR/sync/checkpoints measures other filters
# on their deltas); without, they go to a temporary directory that is removed.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
config=${2:-configs/tiny_moe.json}
if [ -n "${3:-}" ]; then
  out=$3
  mkdir -p "$out"
  [ -z "$(ls -A "$out")" ] || { echo "bench_checkpoint: $out is not empty" >&2; exit 2; }
else
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
every=5
common=(--set train.steps=40 --set train.log_every=1 --set train.eval_every=0 --set train.eval_sequences=1 --quiet)

"$build/bin/moe" train --config "$config" "${common[@]}" --run-dir "$out/none"
for mode in async sync; do
  flag=$([ "$mode" = async ] && echo true || echo false)
  "$build/bin/moe" train --config "$config" "${common[@]}" --set checkpoint.every=$every --set checkpoint.keep=100 \
    --set checkpoint.full_every=2 --set checkpoint.async=$flag --run-dir "$out/$mode"
done

python3 - "$out" "$config" "$every" <<'PY'
import json, pathlib, statistics, sys
out, config, every = pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
def lines(run): return [json.loads(l) for l in open(out / run / "metrics.jsonl") if '"lm_loss"' in l]
base = lines("none")
tokens_per_step = base[1]["tokens"] - base[0]["tokens"]
step_s = statistics.median(tokens_per_step / l["tokens_per_s"] for l in base[3:])
print(f"config {config}: median step {step_s*1000:.1f} ms without checkpoints")
sizes = {"full": [], "delta": []}
raw = []  # a full checkpoint's elements in bytes, without HDF5's metadata or compression
dtype_bytes = {"f32": 4, "f64": 8, "i64": 8}
for mode in ("async", "sync"):
    # A save's stall: the next line's ckpt_stall_s (a save's step writes its line before the save): the staging
    # and save() (sync: the whole save), and the next update's wait for the snapshot, when the writer thread had
    # not taken it yet, and for the ranks' agreement that it is finite.
    held = {l["step"]: l.get("ckpt_stall_s", 0) for l in lines(mode)}
    stalls = [held[s] + held.get(s + 1, 0) for s in sorted(held) if s % every == 0 or s == max(held)]
    med = statistics.median(stalls)
    print(f"{mode:>5}: median stall per save {med*1000:8.2f} ms = {med/step_s:6.3f} x a step  ({len(stalls)} saves)")
    if mode == "async": async_stall = med / step_s
    if mode != "sync": continue
    for d in sorted((out / mode / "checkpoints").glob("step-*")):
        m = json.load(open(d / "manifest.json"))
        sizes[m["kind"]].append(sum(f["size"] for f in m["files"]))
        if m["kind"] == "full":
            raw.append(sum(e["range"][1] * dtype_bytes[e["dtype"]] for f in m["files"] for e in f["datasets"]))
full, delta, raw = statistics.median(sizes["full"]), statistics.median(sizes["delta"]), statistics.median(raw)
print(f"checkpoint size: full {full/2**20:.2f} MiB ({raw/2**20:.2f} MiB uncompressed), delta {delta/2**20:.2f} MiB: "
      f"delta/full = {delta/full:.3f}, delta/uncompressed full = {delta/raw:.3f}")
print(json.dumps({"config": config, "step_s": step_s, "full_bytes": full, "full_uncompressed_bytes": raw,
                  "delta_bytes": delta, "delta_over_full": delta / full, "delta_over_uncompressed_full": delta / raw,
                  "async_stall_over_step": async_stall}))
PY
