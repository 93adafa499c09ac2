#!/usr/bin/env bash
# `moe train`'s TensorBoard event files read by TensorBoard's own reader (EventAccumulator, and the plugin
# accumulator its server uses), installed from PyPI at the versions of tests/requirements-tensorboard.txt into a
# virtual environment VENV (made or remade only when missing or made from another version of that file):
# - every scalar of metrics.jsonl is there at its step with its value (as float32), each MoE layer's
#   tokens_per_expert is a histogram over expert index;
# - a run stopped and resumed is one series equal to the uninterrupted run's;
# - a run killed mid-write (its events file cut inside a record) and resumed from an earlier checkpoint with
#   another learning rate is one monotone series holding the resumed run's values, not the dead start's;
# - a file cut or damaged inside a record reads up to the damage;
# - two ranks write one file, rank 0's;
# - a sweep's cells are TensorBoard runs named by their grid point; train.tensorboard=false writes none;
# - a fresh start removes only the events files; a link planted as RUN_DIR/tensorboard is refused.
# When the environment cannot be made (no network) the test fails, unless MOE_TEST_OFFLINE=1 says this machine
# is offline: then it is skipped (exit 77).
#
# Usage: test_tensorboard.sh MOE_BINARY SOURCE_DIR VENV
set -eu

source "$(dirname "$0")/pinned_venv.sh"
venv_test_start moe_tensorboard tests/requirements-tensorboard.txt TensorBoard -- "$@"
small=(--set train.steps=8 --set model.d_model=32 --set model.layers=2 --set model.heads=2 --set model.ffn_hidden=32
  --set moe.num_experts=4 --set moe.expert_hidden=32 --set train.seq_len=16 --set train.global_batch=2
  --set train.micro_batch=1 --set train.eval_sequences=2 --set train.threads=1 --set train.log_every=2
  --set train.eval_every=4 --set checkpoint.every=4 --quiet)
train() { "$moe" train --config "$config" "${small[@]}" "$@" > /dev/null; }

# An uninterrupted run; the same stopped after step 4 and resumed.
train --run-dir whole
train --run-dir stopped --stop-after-step 4
train --run-dir stopped
# Killed mid-write: a whole run whose events file is then cut inside its last record, resumed from step 4's
# checkpoint with another learning rate (its steps 5-8 differ from what the dead start wrote).
train --run-dir killed
events=(killed/tensorboard/events.out.tfevents.*)
truncate -s -7 "${events[0]}"
train --run-dir killed --resume killed/checkpoints/step-00000004 --set optim.lr=0.0005
# train.tensorboard=false: no directory.
train --run-dir off --set train.tensorboard=false --set train.steps=2
if [ -e off/tensorboard ]; then
  echo "FAIL: train.tensorboard=false wrote off/tensorboard" >&2
  exit 1
fi
# Two data-parallel ranks: rank 0 alone writes (one file, the lines of metrics.jsonl).
mpirun=(mpirun --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 --timeout 120)
[ "$(id -u)" = 0 ] && mpirun+=(--allow-run-as-root)
"${mpirun[@]}" -np 2 "$moe" train --config "$config" "${small[@]}" --set parallel.dp=2 --set train.steps=4 \
  --run-dir two > /dev/null
# A fresh start (--overwrite) removes the events files of the run it replaces, and nothing else there.
train --run-dir again --set train.steps=2
echo mine > again/tensorboard/notes.txt
train --run-dir again --set train.steps=2 --overwrite
left=$(ls again/tensorboard | tr '\n' ' ')
case "$left" in
  "events.out.tfevents."*" notes.txt ") ;;
  *)
    echo "FAIL: after --overwrite again/tensorboard holds: $left" >&2
    exit 1
    ;;
esac
# A link planted as RUN_DIR/tensorboard: refused (exit 2, naming it) before anything is written.
mkdir -p linked elsewhere
ln -s "$work/elsewhere" linked/tensorboard
set +e
"$moe" train --config "$config" "${small[@]}" --run-dir linked > linked.out 2>&1
rc=$?
set -e
if [ $rc -ne 2 ] || ! grep -q "linked/tensorboard" linked.out || [ -e linked/config.json ] \
  || [ -n "$(ls -A elsewhere)" ]; then
  echo "FAIL: a link at RUN_DIR/tensorboard: exit $rc, $(cat linked.out)" >&2
  exit 1
fi
# A sweep of two cells.
"$moe" sweep --config "$config" "${small[@]}" --set train.steps=2 --grid moe.router.tau=0.5,1.0 --out sweep \
  > /dev/null

"$venv/bin/python" "$src/tests/cli/check_tensorboard.py" "$work"
