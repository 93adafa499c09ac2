"""Reads the runs tests/cli/test_tensorboard.sh made with TensorBoard's own readers and checks them against
their metrics.jsonl (docs/metrics.md "TensorBoard"). Usage: check_tensorboard.py WORK_DIR"""
import glob
import json
import os
import shutil
import sys

import numpy as np
from tensorboard.backend.event_processing import event_accumulator, plugin_event_accumulator
from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer
from tensorboard.util import tensor_util

WORK = sys.argv[1]
# Machine-dependent fields: equal between two runs only in their steps.
TIMING = {"train/tokens_per_s", "train/elapsed_s", "train/comm_wait_s", "train/ckpt_stall_s", "train/a2a_wait_s",
          "train/threads", "train/host_syncs", "train/d2h_bytes"}
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def expected(line):
    """The tags docs/metrics.md gives a metrics line: ({scalar tag: value}, {histogram tag: counts})."""
    scalars, histograms = {}, {}

    def numbers(tag, v):
        if is_number(v):
            scalars[tag] = v
        elif isinstance(v, dict):
            for k, x in v.items():
                numbers(tag + "/" + k, x)

    for key, value in line.items():
        if key in ("step", "alerts"):
            continue
        if key == "moe":
            for layer, fields in enumerate(value):
                for field, x in fields.items():
                    if field == "tokens_per_expert":
                        histograms[f"moe/tokens_per_expert/layer_{layer}"] = x
                    elif is_number(x):
                        scalars[f"moe/{field}/layer_{layer}"] = x
        elif "loss" in key:
            numbers("loss/" + key, value)
        else:
            numbers(key if isinstance(value, dict) else "train/" + key, value)
    return scalars, histograms


def numeric_leaves(v):
    """How many numbers a line holds, lists aside (moe's per-expert lists are the histograms)."""
    if is_number(v):
        return 1
    if isinstance(v, dict):
        return sum(numeric_leaves(x) for x in v.values())
    return 0


def metrics(run):
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def series(lines):
    """{tag: [(step, value)]} and {histogram tag: [(step, counts)]} that the lines should give."""
    scalars, histograms = {}, {}
    for line in lines:
        s, h = expected(line)
        leaves = numeric_leaves({k: v for k, v in line.items() if k not in ("step", "alerts", "moe")})
        leaves += sum(numeric_leaves(layer) for layer in line.get("moe", []))
        check(len(s) == leaves, f"step {line['step']}: {len(s)} tags for {leaves} numbers")
        for tag, v in s.items():
            scalars.setdefault(tag, []).append((line["step"], v))
        for tag, v in h.items():
            histograms.setdefault(tag, []).append((line["step"], v))
    return scalars, histograms


def load(path):
    acc = event_accumulator.EventAccumulator(path, size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    return acc


def read_scalars(acc):
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def f32(v):
    return float(np.float32(v))


def compare(name, acc, lines, ignore=()):
    want, want_h = series(lines)
    got = read_scalars(acc)
    check(set(got) == set(want), f"{name}: tags differ: missing {sorted(set(want) - set(got))}, "
                                 f"extra {sorted(set(got) - set(want))}")
    for tag, points in want.items():
        have = got.get(tag, [])
        steps = [s for s, _ in have]
        check(steps == sorted(set(steps)), f"{name}: {tag}: steps not one increasing series: {steps}")
        check(steps == [s for s, _ in points], f"{name}: {tag}: steps {steps}, metrics.jsonl {[s for s, _ in points]}")
        if tag not in ignore:
            check([v for _, v in have] == [f32(v) for _, v in points],
                  f"{name}: {tag}: values {[v for _, v in have]}, metrics.jsonl {[v for _, v in points]}")
    check(set(acc.Tags()["histograms"]) == set(want_h), f"{name}: histogram tags {acc.Tags()['histograms']}")
    for tag, points in want_h.items():
        have = [(e.step, [int(c) for c in e.histogram_value.bucket]) for e in acc.Histograms(tag)]
        check(have == points, f"{name}: {tag}: {have}, metrics.jsonl {points}")
    return got


def tensorboard_dir(run):
    return os.path.join(WORK, run, "tensorboard")


# Every scalar of metrics.jsonl, with its step and value; the chartable fields the docs name are among them.
whole_lines = metrics(os.path.join(WORK, "whole"))
whole = compare("whole", load(tensorboard_dir("whole")), whole_lines)
for tag in ["loss/loss", "loss/lm_loss", "loss/aux_loss", "loss/z_loss", "loss/eval_loss", "train/lr",
            "train/grad_norm", "train/tokens_per_s", "train/dead_experts", "moe/entropy/layer_0", "moe/cv/layer_1",
            "moe/load_max_over_mean/layer_0", "moe/overflow_ratio/layer_0", "moe/dropped/layer_0",
            "moe/tau/layer_0", "moe/capacity_factor/layer_0"]:
    check(tag in whole, f"whole: no {tag}")
check(any(t.startswith("loss/eval_loss_by_source/") for t in whole), "whole: no eval loss by source")
check(any(t.startswith("data/share/") for t in whole), "whole: no data share")
check([s for s, _ in whole["loss/lm_loss"]] == [1, 2, 4, 6, 8], f"whole: lm_loss steps {whole['loss/lm_loss']}")

# TensorBoard's server reads through the plugin accumulator: the same steps and values there.
plugin = plugin_event_accumulator.EventAccumulator(tensorboard_dir("whole"), size_guidance={"tensors": 0})
plugin.Reload()
check([(e.step, tensor_util.make_ndarray(e.tensor_proto).item()) for e in plugin.Tensors("loss/lm_loss")]
      == whole["loss/lm_loss"], "whole: the plugin accumulator reads other lm_loss points")

# Stopped and resumed: two files, one series, equal to the uninterrupted run's but for the machine's fields.
check(len(glob.glob(os.path.join(tensorboard_dir("stopped"), "events.out.tfevents.*"))) == 2, "stopped: not 2 files")
stopped_lines = metrics(os.path.join(WORK, "stopped"))
stopped = compare("stopped", load(tensorboard_dir("stopped")), stopped_lines)
for tag in whole:
    if tag not in TIMING:
        check(stopped.get(tag) == whole[tag], f"stopped: {tag} {stopped.get(tag)} != uninterrupted {whole[tag]}")

# Killed mid-write and resumed from step 4 with another learning rate: the dead start's steps 5-8 are dropped.
killed = compare("killed", load(tensorboard_dir("killed")), metrics(os.path.join(WORK, "killed")))
check(killed["train/lr"][:3] == whole["train/lr"][:3], "killed: steps up to 4 are not the first start's")
check(killed["train/lr"][3:] != whole["train/lr"][3:], "killed: steps after 4 are the dead start's")

# Two ranks: one file, rank 0's lines.
check(len(glob.glob(os.path.join(tensorboard_dir("two"), "*"))) == 1, "two ranks: not one file")
compare("two ranks", load(tensorboard_dir("two")), metrics(os.path.join(WORK, "two")))

# Cut or damaged inside a record: read up to the damage.
first = sorted(glob.glob(os.path.join(tensorboard_dir("whole"), "events.out.tfevents.*")))[0]
with open(first, "rb") as f:
    data = f.read()
offsets, at = [], 0
while at < len(data):
    offsets.append(at)
    at += 16 + int.from_bytes(data[at:at + 8], "little")
check(len(offsets) == 2 + len(whole_lines), f"whole: {len(offsets)} records for {len(whole_lines)} lines")
for damage, k in [("cut", len(offsets) - 1), ("cut", 5), ("flipped", 5), ("flipped", 3)]:
    directory = os.path.join(WORK, f"{damage}-{k}")
    os.makedirs(directory)
    broken = bytearray(data[:offsets[k] + 20] if damage == "cut" else data)
    if damage == "flipped":
        broken[offsets[k] + 14] ^= 0x40
    with open(os.path.join(directory, os.path.basename(first)), "wb") as f:
        f.write(broken)
    compare(f"{damage} in record {k}", load(directory), whole_lines[:k - 2])

# A sweep: one TensorBoard run per cell, named by its grid point.
multiplexer = EventMultiplexer(size_guidance={"scalars": 0, "histograms": 0})
multiplexer.AddRunsFromDirectory(os.path.join(WORK, "sweep"))
multiplexer.Reload()
cells = sorted(os.listdir(os.path.join(WORK, "sweep", "cells")))
check(len(cells) == 2 and all("tau=" in c for c in cells), f"sweep cells {cells}")
check(sorted(multiplexer.Runs()) == [f"cells/{c}/tensorboard" for c in cells], f"sweep runs {multiplexer.Runs()}")
for c in cells:
    compare(f"cell {c}", multiplexer.GetAccumulator(f"cells/{c}/tensorboard"),
            metrics(os.path.join(WORK, "sweep", "cells", c)))

for f in failures:
    print("FAIL:", f)
print(f"{len(failures)} failures" if failures else "TensorBoard read every run as metrics.jsonl says")
sys.exit(1 if failures else 0)
