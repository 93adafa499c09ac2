#!/usr/bin/env bash
# The checkpoint files are readable without this program (docs/checkpoint.md, "Reading a checkpoint without this
# program"): h5py reads every dataset of a full checkpoint and of a delta, and the delta's values rebuilt by
# hand (the base's words XOR the delta's, per docs/checkpoint.md "Deltas") equal, bit for bit, what
# `moe ckpt export --all` gives for the delta's step. Skipped (exit 77) when no python3 with h5py and numpy
# is found (Debian: python3-h5py).
#
# Usage: test_ckpt_h5py.sh MOE_BINARY SOURCE_DIR
set -eu

if [ $# -ne 2 ]; then
  echo "usage: $0 MOE_BINARY SOURCE_DIR" >&2
  exit 2
fi
moe=$1
config="$2/configs/tiny_moe.json"
# The first python3 that has h5py: a python3 of pyenv or a virtual environment may lack Debian's modules.
python=""
for candidate in python3 /usr/bin/python3; do
  if command -v "$candidate" > /dev/null && "$candidate" -c "import h5py, numpy" 2> /dev/null; then
    python=$candidate
    break
  fi
done
if [ -z "$python" ]; then
  echo "skipped: no python3 with h5py and numpy (install python3-h5py)"
  exit 77
fi
unset OMPI_COMM_WORLD_SIZE PMI_SIZE PMIX_SIZE OMPI_COMM_WORLD_LOCAL_SIZE MPI_LOCALNRANKS

work=$(mktemp -d "${TMPDIR:-/tmp}/moe_ckpt_h5py.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
# One rank: checkpoints at steps 2 (full) and 4 (delta).
"$moe" train --config "$config" --set train.steps=4 --set model.d_model=32 --set model.layers=1 \
  --set model.heads=2 --set model.ffn_hidden=32 --set moe.num_experts=4 --set moe.expert_hidden=32 \
  --set train.seq_len=16 --set train.global_batch=2 --set train.micro_batch=1 --set train.eval_sequences=2 \
  --set train.threads=1 --set checkpoint.every=2 --set checkpoint.full_every=2 --quiet --run-dir run > /dev/null
"$moe" ckpt export run/checkpoints/step-00000004 --all --out export.h5 > /dev/null

"$python" - run/checkpoints export.h5 << 'PY'
import glob, json, os, sys
import h5py, numpy as np

root, export = sys.argv[1], sys.argv[2]

def pieces(directory):
    """{dataset: (array, attributes)} of every primary rank file of a checkpoint."""
    out = {}
    for path in sorted(glob.glob(os.path.join(directory, "rank-*.h5"))):
        with h5py.File(path, "r") as f:
            def visit(name, obj):
                if isinstance(obj, h5py.Dataset):
                    out[(path, name)] = (obj[...], dict(obj.attrs))
            f.visititems(visit)
    return out

full = pieces(os.path.join(root, "step-00000002"))
delta = pieces(os.path.join(root, "step-00000004"))
manifest = json.load(open(os.path.join(root, "step-00000004", "manifest.json")))
assert manifest["kind"] == "delta" and manifest["chain"] == ["step-00000002", "step-00000004"], manifest["chain"]
xor = {e["dataset"]: e for f in manifest["files"] for e in f["datasets"]}
with h5py.File(export, "r") as ex:
    checked = 0
    for (path, name), (bits, attrs) in delta.items():
        base, _ = full[(path.replace("step-00000004", "step-00000002"), name)]
        entry = xor[name]
        if entry["xor_delta"]:
            assert bits.dtype == np.uint32, (name, bits.dtype)
            words = np.ascontiguousarray(base).view(np.uint32).ravel() ^ bits.ravel()
            values = words.view(base.dtype)
        else:
            values = bits.ravel()
        whole = ex[entry["tensor"]][...]
        if whole.ndim == 0:
            whole = whole.reshape(1)
        start, shape = attrs["slab_start"], attrs["slab_shape"]
        begin, count = (int(x) for x in attrs["range"])
        if entry["xor_delta"] and base.dtype.itemsize == 8:  # a delta of a 64-bit tensor is in 32-bit words
            start, shape, begin, count = start[:-1], shape[:-1], begin // 2, count // 2
        box = tuple(slice(s, s + n) for s, n in zip(start, shape))
        expected = whole[box].ravel()[begin:begin + count] if box else whole.ravel()[begin:begin + count]
        assert expected.dtype == values.dtype, (name, expected.dtype, values.dtype)
        assert expected.tobytes() == values.tobytes(), f"{name}: the delta rebuilt by h5py differs from the export"
        checked += 1
assert checked == len(delta) and checked > 0
print(f"h5py read {len(full)} full and {checked} delta datasets; the delta rebuilt by hand equals the export")
PY
