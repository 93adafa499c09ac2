#!/usr/bin/env python3
"""Candidate HDF5 filters and delta transforms on the deltas of a real run (docs/bench.md, "Checkpoints").

Usage: python3 bench/ckpt_filters.py CHECKPOINT_ROOT [FILTERS] [TRANSFORMS]
  CHECKPOINT_ROOT  RUN_DIR/checkpoints of a one-rank run with checkpoint.full_every = 2 (each delta's chain is
                   a full checkpoint and the delta), e.g. the runs of bench/bench_checkpoint.sh
  FILTERS          comma-separated, default all: shuffle+deflate4 (what deltas use), blosc:CNAME:LEVEL:SHUFFLE
                   (SHUFFLE bit, byte or no), lz4, shuffle+lz4, shuffle+bzip2
  TRANSFORMS       comma-separated, default xor,sub: xor (what deltas store), sub (the difference of the 32-bit
                   words, zigzag-coded so that small changes either way have leading zero bits)

Needs h5py and hdf5plugin (Debian: python3-h5py, python3-hdf5plugin, hdf5-filter-plugin,
hdf5-filter-plugin-blosc-serial). For each delta of the root it rebuilds the words of the delta's step from
the full checkpoint and the delta, applies each transform, writes every dataset with each filter the way the
checkpoint writer does (chunks of at most 2^20 elements, Fletcher-32), checks the read back is exact, and
prints the median over the deltas of the file size (as a fraction of the uncompressed words), the write time
(one thread, page cache, no fsync) and the read time. Then the entropy of each bit plane summed over the 32
bits of a word: no coder that sees the bits of a word independently of each other can do better.
"""
import glob
import json
import os
import statistics
import sys
import tempfile
import time

import h5py
import hdf5plugin
import numpy as np


def datasets(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[...]) if isinstance(obj, h5py.Dataset) else None)
    return out


def words(a):
    return np.ascontiguousarray(a).view(np.uint32).ravel()


def pairs_of(root):
    """(words of the base, words of the delta's step) per dataset, for each delta whose chain is 2 long."""
    pairs = []
    for d in sorted(glob.glob(os.path.join(root, "step-*"))):
        m = json.load(open(os.path.join(d, "manifest.json")))
        if m["kind"] != "delta" or len(m["chain"]) != 2:
            continue
        if len([f for f in m["files"] if not f.get("peer_copy")]) != 1:
            sys.exit("ckpt_filters: one-rank runs only")
        base = datasets(os.path.join(root, m["chain"][0], "rank-00000.h5"))
        delta = datasets(os.path.join(d, "rank-00000.h5"))
        pairs.append({k: (words(base[k]), words(base[k]) ^ words(x)) for k, x in delta.items()})
    return pairs


def transform(name, prev, cur):
    if name == "xor":
        return prev ^ cur
    if name == "sub":
        d = (cur.astype(np.int64) - prev.astype(np.int64)).astype(np.int32).astype(np.int64)
        return ((d << 1) ^ (d >> 63)).astype(np.uint32)
    raise SystemExit(f"ckpt_filters: unknown transform {name}")


def filter_args(name):
    if name == "shuffle+deflate4":
        return dict(shuffle=True, compression="gzip", compression_opts=4)
    if name.startswith("blosc:"):
        _, cname, level, shuffle = name.split(":")
        mode = {"bit": hdf5plugin.Blosc.BITSHUFFLE, "byte": hdf5plugin.Blosc.SHUFFLE, "no": hdf5plugin.Blosc.NOSHUFFLE}
        return dict(**hdf5plugin.Blosc(cname=cname, clevel=int(level), shuffle=mode[shuffle]))
    if name == "lz4":
        return dict(**hdf5plugin.LZ4())
    if name == "shuffle+lz4":
        return dict(shuffle=True, **hdf5plugin.LZ4())
    if name == "shuffle+bzip2":
        return dict(shuffle=True, **hdf5plugin.BZip2(blocksize=9))
    raise SystemExit(f"ckpt_filters: unknown filter {name}")


def write_and_read(path, arrays, name):
    t0 = time.perf_counter()
    with h5py.File(path, "w", libver=("v108", "v108")) as f:
        for k, a in arrays.items():
            f.create_dataset(k, data=a, chunks=(min(a.size, 1 << 20),), fletcher32=True, **filter_args(name))
    write_s = time.perf_counter() - t0
    size = os.path.getsize(path)
    t0 = time.perf_counter()
    with h5py.File(path, "r") as f:
        for k, a in arrays.items():
            if not np.array_equal(f[k][...], a):
                raise SystemExit(f"ckpt_filters: {name} did not give back {k} exactly")
    return size, write_s, time.perf_counter() - t0


def bit_plane_bound(arrays):
    bits = total = 0
    for a in arrays.values():
        p = np.clip(((a[:, None] >> np.arange(32, dtype=np.uint32)) & 1).mean(0), 1e-12, 1 - 1e-12)
        bits += (-(p * np.log2(p) + (1 - p) * np.log2(1 - p))).sum() * a.size
        total += 32 * a.size
    return bits / total


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    filters = (sys.argv[2] if len(sys.argv) > 2 else "shuffle+deflate4,blosc:lz4:5:bit,blosc:zstd:1:bit,"
               "blosc:zstd:3:bit,blosc:zstd:5:bit,blosc:zstd:3:byte,blosc:lz4:5:byte,blosc:zlib:5:bit,lz4,"
               "shuffle+lz4,shuffle+bzip2").split(",")
    transforms = (sys.argv[3] if len(sys.argv) > 3 else "xor,sub").split(",")
    pairs = pairs_of(sys.argv[1])
    if not pairs:
        sys.exit("ckpt_filters: no delta whose chain is a full checkpoint and itself (use checkpoint.full_every=2)")
    raw = sum(p.nbytes for p, _ in pairs[0].values())
    print(f"{len(pairs)} deltas, {raw / 2**20:.2f} MiB of words each; medians over the deltas")
    print("| transform | filter | delta | of the words | write (ms) | read (ms) |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    tmp = tempfile.mkdtemp()
    try:
        for tr in transforms:
            for fn in filters:
                runs = [write_and_read(os.path.join(tmp, "w.h5"), {k: transform(tr, p, c) for k, (p, c) in pair.items()},
                                       fn) for pair in pairs]
                size, w, r = (statistics.median(x) for x in zip(*runs))
                print(f"| {tr} | {fn} | {size / 2**20:.2f} MiB | {size / raw:.3f} | {w * 1000:.0f} | {r * 1000:.0f} |",
                      flush=True)
        for tr in transforms:
            bound = statistics.median(
                bit_plane_bound({k: transform(tr, p, c) for k, (p, c) in pair.items()}) for pair in pairs)
            print(f"bit-plane entropy of {tr}: {bound:.3f} of the words")
    finally:
        for f in glob.glob(os.path.join(tmp, "*")):
            os.remove(f)
        os.rmdir(tmp)


if __name__ == "__main__":
    main()
