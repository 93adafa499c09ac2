#!/usr/bin/env bash
# bench/device_check.sh without a GPU: the library path it runs the checks under holds NVRTC's directory (cuDNN
# opens NVRTC for its fused attention engines), wherever the wheels keep it; and it reports the cuBLAS, cuDNN,
# NCCL and NVRTC that path loads, each one's version or why it could not be read.
# Usage: test_device_check.sh SOURCE_DIR
set -euo pipefail
src=$1
script="$src/bench/device_check.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# Wheels laid out two ways: cu13's one shared directory, and NVRTC in a package of its own beside it.
mkdir -p "$tmp/py/nvidia/cu13/lib" "$tmp/py/nvidia/cuda_nvrtc/lib"
touch "$tmp/py/nvidia/__init__.py"
for lib in libcublas.so.13 libcudnn.so.9 libnccl.so.2; do touch "$tmp/py/nvidia/cu13/lib/$lib"; done
touch "$tmp/py/nvidia/cuda_nvrtc/lib/libnvrtc.so.13" "$tmp/py/nvidia/cuda_nvrtc/lib/libnvrtc-builtins.so.13.0"
path=$(PYTHONPATH="$tmp/py" LD_LIBRARY_PATH=/keep bash "$script" libpath /root-of-pack)
IFS=: read -r -a dirs <<< "$path"
[ "${dirs[0]}" = /root-of-pack/lib ] || fail "the pack's libraries are not first: $path"
for want in "$tmp/py/nvidia/cu13/lib" "$tmp/py/nvidia/cuda_nvrtc/lib" /keep; do
  printf '%s\n' "${dirs[@]}" | grep -qx "$want" || fail "$want missing from the library path: $path"
done
# NVRTC in the shared directory only: still found.
mv "$tmp/py/nvidia/cuda_nvrtc/lib/"* "$tmp/py/nvidia/cu13/lib/" && rm -r "$tmp/py/nvidia/cuda_nvrtc"
path=$(PYTHONPATH="$tmp/py" bash "$script" libpath /r)
[ "$(printf '%s\n' "${path//:/$'\n'}" | grep -cx "$tmp/py/nvidia/cu13/lib")" -ge 3 ] ||
  fail "cuBLAS, NCCL and NVRTC's shared directory not all on the path: $path"

# The versions: four entries, each a version with the file it came from, or an error naming the library.
check_versions() {
  python3 - "$1" "$2" <<'PY'
import json, re, sys
report, must_load = json.loads(sys.argv[1]), sys.argv[2].split(",") if sys.argv[2] else []
assert sorted(report) == ["cublas", "cudnn", "nccl", "nvrtc"], report
for name, entry in report.items():
    if "version" in entry:
        assert re.fullmatch(r"\d+\.\d+(\.\d+)?", entry["version"]), (name, entry)
        assert entry["file"] and ("lib" + name) in entry["file"], (name, entry)
    else:
        assert "lib" + name in entry["error"], (name, entry)
        assert name not in must_load, (name, "not loaded although this machine has it", entry)
PY
}
loadable=$(python3 -c 'import ctypes
names = []
for name, so in (("cublas", "libcublas.so.13"), ("cudnn", "libcudnn.so.9"), ("nccl", "libnccl.so.2"), ("nvrtc", "libnvrtc.so.13")):
    try:
        ctypes.CDLL(so); names.append(name)
    except OSError:
        pass
print(",".join(names))')
check_versions "$(bash "$script" versions)" "$loadable" || fail "versions on this machine's libraries"
# A library the path offers that is no library (an empty file first on the path): an error for it, the rest read.
mkdir -p "$tmp/broken" && touch "$tmp/broken/libnccl.so.2"
report=$(LD_LIBRARY_PATH="$tmp/broken" bash "$script" versions)
check_versions "$report" "${loadable//nccl/}" || fail "versions with a broken libnccl: $report"
python3 -c 'import json, sys; assert "error" in json.loads(sys.argv[1])["nccl"]' "$report" ||
  fail "a broken libnccl.so.2 reported as loaded: $report"

rc=0
bash "$script" nonsense > /dev/null 2> "$tmp/err" || rc=$?
[ "$rc" = 2 ] && grep -q usage "$tmp/err" || fail "an unknown subcommand: exit $rc, $(cat "$tmp/err")"
echo "device_check.sh: library path and runtime versions as expected"
