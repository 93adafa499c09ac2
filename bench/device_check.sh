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
#   bench/device_check.sh libpath [ROOT]     prints the LD_LIBRARY_PATH `run` sets (ROOT: the unpacked pack)
#   bench/device_check.sh versions           prints, as JSON, the cuBLAS, cuDNN, NCCL and NVRTC that this library
#                                            path loads: each one's version and file (no device needed)
#
# What it checks: the device is seen; the CUDA backend's host-side tests; NCCL on one rank (every collective,
# grouped sends and receives); the op conformance suites with the cuda backend beside the cpu one (every op
# in fp32 and fp64 against the CPU reference; bf16 GEMMs, grouped GEMMs and attention against the GEMMs of
# the rounded operands); the MoE layer on cuda routing exactly as on
# the cpu (drop, reroute, dense fallback; Gumbel noise) with outputs and gradients within fp32 tolerance;
# cuDNN's fused attention against the CPU's fused reference at bf16 bounds (B 2 T 128 H 4 Dh 64, B 1 T 1024 H 2
# Dh 128, Mixtral's B 1 T 4096 H 32 Dh 128), failing where cuDNN refused a shape instead of falling back;
# bench_cuda's cuBLAS bf16 and fp32 GEMM peaks and the backend's gemm and grouped expert GEMM against them at
# both precisions; 20 steps of configs/tiny_moe.json on one rank on cuda against cpu, in fp32 (each step's
# loss within 2e-3 relative) and in bf16 (within 2e-2); and the MFU of configs/bench_mixtral.json (Mixtral's
# layer: d_model 4096, 8 experts top-2, expert hidden 14336, sequence 4096; bf16 GEMMs) against the bf16 peak,
# with where its step's GPU time goes (forward, backward, the MoE layers' router, dispatch, experts and combine,
# clipping, optimizer) from the trace's device track of steps 7 and 8.
set -euo pipefail
cd "$(dirname "$0")/.."

programs=(test_core_cuda_host test_core_ops test_core_moe_ops test_core_gemm_precision test_core_moe_backends
  test_core_fused_attention test_nccl_plan)

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
        libc.so.*|libm.so.*|libdl.so.*|librt.so.*|libpthread.so.*|ld-linux*|libcublas*|libcudart*|libnccl*|libcuda.so*|libcudnn*) ;;
        *) cp -L -n "$lib" "$stage/lib/" ;;
      esac
    done
  done
  cp configs/tiny_moe.json configs/bench_mixtral.json "$stage/"
  git rev-parse HEAD > "$stage/commit"
  tar -C "$stage" -cJf .device/pack.tar.xz .
  rm -rf "$stage"
  local exclude
  exclude=$(git rev-parse --git-path info/exclude)  # a worktree's .git is a file
  grep -qx '/.device/' "$exclude" 2>/dev/null || echo '/.device/' >> "$exclude"
  echo "device_check: .device/pack.tar.xz, $(du -h .device/pack.tar.xz | cut -f1) (carry .device)"
}

# The directory of a library inside the machine's Python wheels (nvidia.cublas -> .../nvidia/cublas/lib).
wheel_lib() {
  python3 -c "import importlib, os; m = importlib.import_module('$1'); print(os.path.join(list(m.__path__)[0], 'lib'))" 2>/dev/null || true
}

# The directory of the first file named $1 anywhere inside the wheels' nvidia package (libcudnn.so.9: the
# cu13 wheels do not all keep the nvidia.<name>/lib layout).
wheel_file_dir() {
  python3 -c "import glob, os, nvidia
for p in nvidia.__path__:
    found = sorted(glob.glob(os.path.join(p, '**', '$1'), recursive=True))
    if found:
        print(os.path.dirname(found[0])); break" 2>/dev/null || true
}

# The packed libraries, then cuBLAS, the CUDA runtime, cuDNN (fused attention) and NCCL from the wheels; and NVRTC
# with its builtins, which cuDNN 9 opens at run time for its runtime-fused engines (the SDPA flash engines among
# them): without it cuDNN refuses the fused attention graphs. cuDNN's engine libraries open from its directory.
library_path() {
  local root=$1
  echo "$root/lib:$(wheel_lib nvidia.cublas):$(wheel_lib nvidia.cuda_runtime):$(wheel_file_dir 'libcudnn.so.9'):$(wheel_file_dir 'libcublas.so.*'):$(wheel_file_dir 'libnccl.so.*'):$(wheel_file_dir 'libnvrtc.so.*'):$(wheel_file_dir 'libnvrtc-builtins.so.*'):${LD_LIBRARY_PATH:-}"
}

# The runtime libraries the current LD_LIBRARY_PATH (and the system's) loads, as JSON: each one's version as its
# own API reports it and the file the loader chose. They may differ from the headers the build used (a GPU
# machine's wheels are PyTorch's), so the device check records them beside its figures.
versions() {
  python3 - <<'PY'
import ctypes, json, os

def loaded_file(stem):
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if os.path.basename(path).startswith(stem):
                return path
    return None

def probe(sonames, read):
    errors = []
    for soname in sonames:
        try:
            lib = ctypes.CDLL(soname)
        except OSError as e:
            errors.append(str(e))
            continue
        try:
            version = read(lib)
        except (AttributeError, RuntimeError) as e:  # an older library without the call, or the call failed
            return {"error": "%s: %s" % (soname, e), "file": loaded_file(soname.split(".so")[0] + ".so")}
        return {"version": version, "file": loaded_file(soname.split(".so")[0] + ".so")}
    return {"error": "; ".join(errors)}

def out_ints(fn, count):
    values = [ctypes.c_int() for _ in range(count)]
    status = fn(*[ctypes.byref(v) for v in values])
    if status != 0:
        raise RuntimeError("status %d" % status)
    return [v.value for v in values]

def cublas(lib):  # libraryPropertyType: MAJOR_VERSION 0, MINOR_VERSION 1, PATCH_LEVEL 2
    return ".".join(str(out_ints(lambda v: lib.cublasGetProperty(k, v), 1)[0]) for k in (0, 1, 2))

def cudnn(lib):
    lib.cudnnGetVersion.restype = ctypes.c_size_t
    v = lib.cudnnGetVersion()  # major * 10000 + minor * 100 + patch since cuDNN 9
    return "%d.%d.%d" % (v // 10000, v % 10000 // 100, v % 100)

def nccl(lib):
    v = out_ints(lib.ncclGetVersion, 1)[0]  # major * 10000 + minor * 100 + patch since NCCL 2.9
    return "%d.%d.%d" % (v // 10000, v % 10000 // 100, v % 100)

def nvrtc(lib):
    return "%d.%d" % tuple(out_ints(lib.nvrtcVersion, 2))

print(json.dumps({
    "cublas": probe(["libcublas.so.13", "libcublas.so.12"], cublas),
    "cudnn": probe(["libcudnn.so.9"], cudnn),
    "nccl": probe(["libnccl.so.2"], nccl),
    "nvrtc": probe(["libnvrtc.so.13", "libnvrtc.so.12"], nvrtc),
}))
PY
}

run() {
  local out=${1:-${OUT:-.}}
  local root=/tmp/moe-device
  mkdir -p "$out" && rm -rf "$root" && mkdir -p "$root"
  tar -C "$root" -xJf .device/pack.tar.xz
  LD_LIBRARY_PATH=$(library_path "$root")
  export LD_LIBRARY_PATH
  echo "$LD_LIBRARY_PATH" > "$out/library_path.txt"
  versions > "$out/runtime_libraries.json" 2>&1 || true
  export OMP_NUM_THREADS=8
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/gpu.txt" 2>&1 || true
  local status=()
  for p in "${programs[@]}"; do
    local rc=0
    timeout 300 "$root/bin/$p" --gtest_output="json:$out/$p.json" > "$out/$p.log" 2>&1 || rc=$?
    status+=("$p=$rc")
  done
  timeout 300 "$root/bin/bench_cuda" --reps 10 > "$out/bench_cuda.log" 2>&1 || true
  # 20 steps of the MoE default on one rank, on each backend at each precision (compared below).
  for precision in fp32 bf16; do
    for device in cpu cuda; do
      local name=${device}_$precision
      timeout 300 "$root/bin/moe" train --config "$root/tiny_moe.json" --set train.device=$device \
        --set train.precision=$precision --set train.steps=20 --set train.eval_every=10 --set checkpoint.every=10 \
        --set train.log_every=1 --run-dir "/tmp/moe-device-$name" --overwrite --quiet > "$out/train_$name.log" 2>&1 || true
      cp "/tmp/moe-device-$name/metrics.jsonl" "$out/metrics_$name.jsonl" 2>/dev/null || true
    done
  done
  # A stack that cannot fit (32 layers, about 1 TiB) is refused before anything is allocated: exit 2, naming the GPU.
  local refusal=0
  timeout 120 "$root/bin/moe" train --config "$root/bench_mixtral.json" --set model.layers=32 \
    --run-dir /tmp/moe-device-refused --overwrite --quiet > "$out/train_refused.log" 2>&1 || refusal=$?
  echo "$refusal" > "$out/refusal_exit_code.txt"
  # The Mixtral-shaped stack in bf16: as many layers as fit (4 of them in fp32 storage: 99 GB of parameters,
  # gradients and AdamW moments, 12 GB of their bf16 copy), else 3.
  for layers in 4 3; do
    rm -rf /tmp/moe-device-mixtral
    if timeout 240 "$root/bin/moe" train --config "$root/bench_mixtral.json" --set model.layers=$layers \
      --set train.trace=true --set train.trace_from=7 --set train.trace_steps=2 \
      --run-dir /tmp/moe-device-mixtral --overwrite --quiet > "$out/train_mixtral.log" 2>&1; then
      echo "$layers" > "$out/mixtral_layers.txt"
      cp /tmp/moe-device-mixtral/metrics.jsonl "$out/metrics_mixtral.jsonl"
      cp /tmp/moe-device-mixtral/trace.json "$out/trace_mixtral.json" 2>/dev/null || true
      break
    fi
  done
  python3 - "$out" "$(cat "$root/commit")" "${status[@]}" <<'EOF'
import json, os, sys
out, commit, statuses = sys.argv[1], sys.argv[2], sys.argv[3:]
report = {"commit": commit, "gpu": open(os.path.join(out, "gpu.txt")).read().strip(), "programs": {}}
try:
    report["runtime_libraries"] = json.load(open(os.path.join(out, "runtime_libraries.json")))
except ValueError:
    report["runtime_libraries"] = {"error": open(os.path.join(out, "runtime_libraries.json")).read()[-2000:]}
report["library_path"] = open(os.path.join(out, "library_path.txt")).read().strip()
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
# The fused attention program's cuDNN cases skip without a device and fail where cuDNN refused a shape.
ran_on_gpu = all(report["programs"][p].get("cuda_cases", 0) > 0 for p in ("test_core_ops", "test_core_moe_ops")) and \
    not report["programs"]["test_core_moe_backends"].get("skipped") and \
    not report["programs"]["test_core_fused_attention"].get("skipped") and \
    not report["programs"]["test_nccl_plan"].get("skipped")
# Training: each step's loss on cuda against cpu (fp32 sums in another order: the curves drift apart slowly; in
# bf16 a value near a rounding boundary can round the other way too).
def losses(name):
    path = os.path.join(out, "metrics_" + name + ".jsonl")
    if not os.path.exists(path):
        return []
    return [json.loads(l)["lm_loss"] for l in open(path) if '"lm_loss"' in l]
report["training"] = {}
for precision, tolerance in (("fp32", 2e-3), ("bf16", 2e-2)):
    cpu, gpu = losses("cpu_" + precision), losses("cuda_" + precision)
    t = {"steps_cpu": len(cpu), "steps_cuda": len(gpu), "lm_loss_cpu": cpu, "lm_loss_cuda": gpu, "tolerance": tolerance}
    if cpu and len(cpu) == len(gpu):
        t["max_relative_difference"] = max(abs(a - b) / abs(a) for a, b in zip(cpu, gpu))
    t["passed"] = len(cpu) == 20 and len(gpu) == 20 and t.get("max_relative_difference", 1) < tolerance
    report["training"][precision] = t
bench = [l for l in open(os.path.join(out, "bench_cuda.log")) if l.startswith("{")]
report["bench_cuda"] = json.loads(bench[-1]) if bench else open(os.path.join(out, "bench_cuda.log")).read()[-2000:]
# MFU of the Mixtral-shaped stack: model FLOPs per token (3 x the forward's matmuls: the projections, the two
# chosen experts' SwiGLU, the router, the head, and attention's q k^T and p v over the full T x T, as
# Megatron-Core counts them) times the median tokens/s of steps 3 and later, over the bf16 GEMM peak measured above.
mfu = {}
path = os.path.join(out, "metrics_mixtral.jsonl")
if os.path.exists(path):
    cfg = json.load(open(os.path.join("/tmp/moe-device", "bench_mixtral.json")))
    L = int(open(os.path.join(out, "mixtral_layers.txt")).read())
    D, T, V = cfg["model"]["d_model"], cfg["train"]["seq_len"], cfg["model"]["vocab"]
    E, K, F = cfg["moe"]["num_experts"], cfg["moe"]["top_k"], cfg["moe"]["expert_hidden"]
    forward = L * (2 * 4 * D * D + 2 * K * 3 * D * F + 2 * D * E + 2 * 2 * T * D) + 2 * D * V
    lines = [json.loads(l) for l in open(path) if '"tokens_per_s"' in l]
    rates = sorted(l["tokens_per_s"] for l in lines if l["step"] >= 3)
    if rates and isinstance(report["bench_cuda"], dict):
        tokens_s = rates[len(rates) // 2]
        achieved = 3 * forward * tokens_s
        mfu = {"layers": L, "tokens_per_s": tokens_s, "model_flops_per_token": 3 * forward,
               "achieved_flops": achieved, "bf16_peak_flops": report["bench_cuda"]["bf16_peak_flops"],
               "mfu": achieved / report["bench_cuda"]["bf16_peak_flops"]}
# Where a Mixtral step's GPU time goes: the trace's device track (CUDA events) of steps 7 and 8, seconds per step
# by span, the micro-batches' forwards and backwards summed, the MoE layers' parts (inside them) apart.
path = os.path.join(out, "trace_mixtral.json")
if os.path.exists(path):
    spans = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X" and e.get("tid") == 1]
    steps = sorted({e["args"]["step"] for e in spans})
    parts = {}
    for e in spans:
        name = e["name"].rsplit(" ", 1)[0] if e["name"].split(" ")[-1].isdigit() else e["name"]
        parts[name] = parts.get(name, 0.0) + e["dur"] / 1e6 / len(steps)
    walls = []
    for s in steps:
        mine = [e for e in spans if e["args"]["step"] == s]
        walls.append((max(e["ts"] + e["dur"] for e in mine) - min(e["ts"] for e in mine)) / 1e6)
    mfu["time_breakdown"] = {"steps": steps, "device_seconds_per_step": dict(sorted(parts.items())),
                             "step_device_span_s": sum(walls) / len(walls)}
report["mixtral_mfu"] = mfu or {"error": open(os.path.join(out, "train_mixtral.log")).read()[-2000:] if os.path.exists(os.path.join(out, "train_mixtral.log")) else "not run"}
refused = open(os.path.join(out, "train_refused.log")).read()
report["memory_refusal"] = {"exit_code": int(open(os.path.join(out, "refusal_exit_code.txt")).read()),
                            "message": refused[-600:]}
report["memory_refusal"]["passed"] = report["memory_refusal"]["exit_code"] == 2 and "more than GPU 0's" in refused
report["passed"] = report["memory_refusal"]["passed"] and ran_on_gpu and all(t["passed"] for t in report["training"].values()) and "mfu" in mfu and all(e["exit_code"] == 0 and not e.get("failures") for e in report["programs"].values())
json.dump(report, open(os.path.join(out, "device_check.json"), "w"), indent=2)
print(json.dumps(report, indent=2))
EOF
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  run) shift; run "$@" ;;
  libpath) shift; library_path "${1:-/tmp/moe-device}" ;;
  versions) versions ;;
  *) echo "usage: bench/device_check.sh pack [BUILD_DIR] | run [OUT_DIR] | libpath [ROOT] | versions" >&2; exit 2 ;;
esac
