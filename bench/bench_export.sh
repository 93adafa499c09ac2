#!/usr/bin/env bash
# Export benchmark: `moe export hf` of one checkpoint, in fp32 and in bf16, against the speed this machine writes
# the same number of bytes with dd into the same file system, measured in the same run. Each figure is the median
# of REPEATS exports into fresh directories; neither side waits for the disk (no fsync: what the program can
# write, the page cache's speed, not the device's). The checkpoint is that of a one-step run of CONFIG at the
# benchmark's size (--quick: a small one, for CI to prove the script runs).
# Usage: bench/bench_export.sh [--quick] [BUILD_DIR] [CONFIG] [REPEATS]   (needs python3)
set -euo pipefail
cd "$(dirname "$0")/.."
quick=false
if [ "${1:-}" = --quick ]; then
  quick=true
  shift
fi
build=${1:-build}
config=${2:-configs/tiny_moe.json}
repeats=${3:-3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

if $quick; then
  size=(--set model.d_model=64 --set model.layers=2 --set moe.expert_hidden=64 --set model.ffn_hidden=128)
else  # about 160 M parameters, 0.6 GB in fp32
  size=(--set model.d_model=512 --set model.layers=8 --set model.heads=8 --set moe.expert_hidden=1536
        --set model.ffn_hidden=1536 --set model.vocab=256)
fi
"$build/bin/moe" train --config "$config" "${size[@]}" --set train.steps=1 --set train.global_batch=1 \
  --set train.micro_batch=1 --set train.eval_every=0 --set train.eval_sequences=1 --set checkpoint.every=1 \
  --quiet --run-dir "$out/run" > /dev/null

seconds() {  # seconds CMD...: the wall time of CMD, its output discarded
  python3 - "$@" <<'PY'
import subprocess, sys, time
t = time.perf_counter()
subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)
print(time.perf_counter() - t)
PY
}

results=$out/results.txt
for dtype in fp32 bf16; do
  for i in $(seq 1 "$repeats"); do
    t=$(seconds "$build/bin/moe" export hf "$out/run" --out "$out/hf-$dtype-$i" --dtype "$dtype")
    bytes=$(du -sb "$out/hf-$dtype-$i" | cut -f1)
    mib=$(( (bytes + 1048575) / 1048576 ))
    d=$(seconds dd if=/dev/zero of="$out/dd-$i" bs=1M count="$mib" status=none)
    echo "$dtype $t $bytes $d $mib" >> "$results"
    rm -rf "$out/hf-$dtype-$i" "$out/dd-$i"
  done
done

python3 - "$results" "$config" "$quick" <<'PY'
import json, statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
report = {"config": sys.argv[2], "quick": sys.argv[3] == "true"}
for dtype in ("fp32", "bf16"):
    mine = [r for r in rows if r[0] == dtype]
    export_mbs = statistics.median(int(r[2]) / float(r[1]) / 1e6 for r in mine)
    dd_mbs = statistics.median(int(r[4]) * 2**20 / float(r[3]) / 1e6 for r in mine)
    size = int(mine[0][2])
    print(f"export hf {dtype}: {size / 1e6:8.1f} MB, median {export_mbs:7.1f} MB/s; dd of as many bytes "
          f"{dd_mbs:7.1f} MB/s; export / dd = {export_mbs / dd_mbs:.3f}  ({len(mine)} runs)")
    report[dtype] = {"bytes": size, "export_mb_s": export_mbs, "dd_mb_s": dd_mbs,
                     "export_over_dd": export_mbs / dd_mbs}
print(json.dumps(report))
PY
