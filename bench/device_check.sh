#!/usr/bin/env bash
# The GPU check of the CUDA backend, made to run once on a bare GPU machine (nvcc, CMake and PyTorch there,
# whose wheels bring cuBLAS and NCCL; no MPI, HDF5 or OpenBLAS) within a few minutes, writing one JSON file.
#
#   bench/device_check.sh pack [BUILD_DIR]   on the build machine (Debian 12, the CUDA toolkit, a build with
#                                            the CUDA backend): the GPU test programs and the shared libraries
#                                            they need besides CUDA's into .device/pack.tar.xz (git ignores
#                                            .device/), a few MB to carry with the source tree
#   bench/device_check.sh run [OUT_DIR]      on the GPU machine, from the repository root with .device carried:
#                                            unpacks, finds cuBLAS in the machine's Python wheels, runs the
#                                            checks and writes OUT_DIR/device_check.json (OUT_DIR: $OUT or .)
#
# What it checks today: the device is seen; the CUDA backend's host-side tests; the op conformance suites with
# the cuda backend beside the cpu one (every op in fp32 and fp64 against the CPU reference); the MoE layer on
# cuda routing exactly as on the cpu (drop, reroute, dense fallback; Gumbel noise) with outputs and gradients
# within fp32 tolerance; bench_cuda's cuBLAS bf16 and fp32 GEMM peaks and the backend's gemm and grouped expert
# GEMM against them; 20 steps of configs/tiny_moe.json on one rank on cuda against cpu (each step's loss within
# 2e-3 relative). Not yet: the bf16 MFU benchmark (no bf16 training yet); the JSON lists it under "not_built".
set -euo pipefail
cd "$(dirname "$0")/.."

programs=(test_core_cuda_host test_core_ops test_core_moe_ops test_core_moe_backends)

pack() {
  local build=${1:-build}
  local stage=.device/stage
  rm -rf "$stage" && mkdir -p "$stage/bin" "$stage/lib"
  for p in "${programs[@]}" bench_cuda moe; do
    [ -x "$build/bin/$p" ] || { echo "device_check: $build/bin/$p is missing: build with the CUDA backend first" >&2; exit 2; }
    cp "$build/bin/$p" "$stage/bin/"
    # Every shared library it needs except the C library's and CUDA's own (the GPU machine has those).
    ldd "$build/bin/$p" | awk '/=> \// {print $3}' | while read -r lib; do
      case "$(basename "$lib")" in
        libc.so.*|libm.so.*|libdl.so.*|librt.so.*|libpthread.so.*|ld-linux*|libcublas*|libcudart*|libnccl*|libcuda.so*) ;;
        *) cp -L -n "$lib" "$stage/lib/" ;;
      esac
    done
  done
  cp configs/tiny_moe.json "$stage/"
  git rev-parse HEAD > "$stage/commit"
  tar -C "$stage" -cJf .device/pack.tar.xz .
  rm -rf "$stage"
  grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> .git/info/exclude
  echo "device_check: .device/pack.tar.xz, $(du -h .device/pack.tar.xz | cut -f1) (carry .device)"
}

# The directory of a library inside the machine's Python wheels (nvidia.cublas -> .../nvidia/cublas/lib).
wheel_lib() {
  python3 -c "import importlib, os; m = importlib.import_module('$1'); print(os.path.join(list(m.__path__)[0], 'lib'))" 2>/dev/null || true
}

run() {
  local out=${1:-${OUT:-.}}
  local root=/tmp/moe-device
  mkdir -p "$out" && rm -rf "$root" && mkdir -p "$root"
  tar -C "$root" -xJf .device/pack.tar.xz
  export LD_LIBRARY_PATH="$root/lib:$(wheel_lib nvidia.cublas):$(wheel_lib nvidia.cuda_runtime):${LD_LIBRARY_PATH:-}"
  export OMP_NUM_THREADS=8
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/gpu.txt" 2>&1 || true
  local status=()
  for p in "${programs[@]}"; do
    local rc=0
    timeout 300 "$root/bin/$p" --gtest_output="json:$out/$p.json" > "$out/$p.log" 2>&1 || rc=$?
    status+=("$p=$rc")
  done
  timeout 300 "$root/bin/bench_cuda" --reps 10 > "$out/bench_cuda.log" 2>&1 || true
  # 20 steps of the MoE default on one rank, on each backend (metrics.jsonl of both compared below).
  for device in cpu cuda; do
    timeout 300 "$root/bin/moe" train --config "$root/tiny_moe.json" --set train.device=$device --set train.steps=20 \
      --set train.eval_every=10 --set checkpoint.every=10 --set train.log_every=1 --run-dir "/tmp/moe-device-$device" \
      --overwrite --quiet > "$out/train_$device.log" 2>&1 || true
    cp "/tmp/moe-device-$device/metrics.jsonl" "$out/metrics_$device.jsonl" 2>/dev/null || true
  done
  python3 - "$out" "$(cat "$root/commit")" "${status[@]}" <<'EOF'
import json, os, sys
out, commit, statuses = sys.argv[1], sys.argv[2], sys.argv[3:]
report = {"commit": commit, "gpu": open(os.path.join(out, "gpu.txt")).read().strip(), "programs": {},
          "not_built": ["bf16 MFU benchmark (Mixtral-shaped stack)"]}
for s in statuses:
    name, rc = s.split("=")
    entry = {"exit_code": int(rc)}
    path = os.path.join(out, name + ".json")
    if os.path.exists(path):
        g = json.load(open(path))
        cases = [t for suite in g.get("testsuites", []) for t in suite.get("testsuite", [])]
        entry["tests"] = len(cases)
        entry["failures"] = [t["classname"] + "." + t["name"] for t in cases if t.get("failures")]
        entry["skipped"] = [t["classname"] + "." + t["name"] for t in cases if t.get("result") == "SKIPPED"]
        entry["cuda_cases"] = sum(1 for t in cases if "cuda" in t.get("value_param", "") + t["name"])
    report["programs"][name] = entry
# Passed: every program green, and the conformance suites really ran on the cuda backend (not only the cpu's).
ran_on_gpu = all(report["programs"][p].get("cuda_cases", 0) > 0 for p in ("test_core_ops", "test_core_moe_ops")) and \
    not report["programs"]["test_core_moe_backends"].get("skipped")
# Training: each step's loss on cuda against cpu (fp32 sums in another order: the curves drift apart slowly).
def losses(device):
    path = os.path.join(out, "metrics_" + device + ".jsonl")
    if not os.path.exists(path):
        return []
    return [json.loads(l)["lm_loss"] for l in open(path) if '"lm_loss"' in l]
cpu, gpu = losses("cpu"), losses("cuda")
training = {"steps_cpu": len(cpu), "steps_cuda": len(gpu), "lm_loss_cpu": cpu, "lm_loss_cuda": gpu}
if cpu and len(cpu) == len(gpu):
    training["max_relative_difference"] = max(abs(a - b) / abs(a) for a, b in zip(cpu, gpu))
training["passed"] = len(cpu) == 20 and len(gpu) == 20 and training.get("max_relative_difference", 1) < 2e-3
report["training"] = training
bench = [l for l in open(os.path.join(out, "bench_cuda.log")) if l.startswith("{")]
report["bench_cuda"] = json.loads(bench[-1]) if bench else open(os.path.join(out, "bench_cuda.log")).read()[-2000:]
report["passed"] = ran_on_gpu and training["passed"] and all(e["exit_code"] == 0 and not e.get("failures") for e in report["programs"].values())
json.dump(report, open(os.path.join(out, "device_check.json"), "w"), indent=2)
print(json.dumps(report, indent=2))
EOF
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  run) shift; run "$@" ;;
  *) echo "usage: bench/device_check.sh pack [BUILD_DIR] | run [OUT_DIR]" >&2; exit 2 ;;
esac
