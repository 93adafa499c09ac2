#!/usr/bin/env bash
# What the program may delete, and whose checkpoints it resumes (docs/checkpoint.md, "What the program deletes"),
# through the real program: checkpoint.dir pointing at a user's directory, at the run directory or above it
# (with and without checkpoints to write), at another run's checkpoints (a second run, a sweep axis over it),
# at a root with a planted link; a checkpoint copied in from another run; a resume keeping its run id; --quiet
# still saying which checkpoint was passed over. A refusal is exit 2 naming the key, with nothing deleted.
#
# Usage: test_owned_paths.sh MOE_BINARY SOURCE_DIR
set -u

if [ $# -ne 2 ]; then
  echo "usage: $0 MOE_BINARY SOURCE_DIR" >&2
  exit 2
fi
moe=$1
config="$2/configs/tiny.json"
unset OMPI_COMM_WORLD_SIZE PMI_SIZE PMIX_SIZE OMPI_COMM_WORLD_LOCAL_SIZE MPI_LOCALNRANKS

small=(--set train.steps=4 --set model.d_model=32 --set model.layers=1 --set model.heads=2
       --set model.ffn_hidden=32 --set train.seq_len=16 --set train.global_batch=2 --set train.micro_batch=1
       --set train.eval_sequences=2 --set train.threads=1 --set checkpoint.every=2 --set checkpoint.async=false
       --quiet)

passed=0
failed=0
check() {  # check DESCRIPTION COMMAND...: the command must succeed
  local what=$1
  shift
  if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)) && echo "FAIL: $what"; fi
}

work=$(mktemp -d "${TMPDIR:-/tmp}/moe_owned_paths.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1

# train RUN_DIR [ARGS...]: exit code in $rc, stderr in $err.
train() {
  local run=$1
  shift
  "$moe" train --config "$config" "${small[@]}" --run-dir "$run" "$@" > out.txt 2> err.txt
  rc=$?
  err=$(cat err.txt)
}
# refused DESCRIPTION NEEDLE...: the last train exited 2 and its stderr holds every needle.
refused() {
  local what=$1
  shift
  check "$what: exit 2 (got $rc; $err)" test "$rc" = 2
  local needle
  for needle in "$@"; do
    check "$what: stderr names '$needle' ($err)" grep -qF -- "$needle" err.txt
  done
}
precious() {  # a user's directory with a file in it
  mkdir -p "$1" && echo "keep me" > "$1/notes.txt"
}
intact() { check "$2: $1/notes.txt kept" grep -q "keep me" "$1/notes.txt"; }

# ---- A user's directory as checkpoint.dir: refused, fresh or not, every or not. --------------------------------
precious "$work/home"
for extra in "" "--overwrite" "--resume none"; do
  # shellcheck disable=SC2086
  train r1 --set checkpoint.dir="$work/home" $extra
  refused "user directory ($extra)" "checkpoint.dir" "$work/home" "notes.txt"
  intact "$work/home" "user directory ($extra)"
done
train r1 --set checkpoint.dir="$work/home" --set checkpoint.every=0
refused "user directory, checkpoint.every 0" "checkpoint.dir" "notes.txt"
intact "$work/home" "user directory, checkpoint.every 0"

# ---- The run directory itself, or a directory above it. -----------------------------------------------------------
mkdir -p parent && echo "keep me" > parent/notes.txt
for dir in "." ".." "$work/parent" "../.."; do
  for every in 2 0; do
    train parent/run --set checkpoint.dir="$dir" --set checkpoint.every=$every
    refused "checkpoint.dir $dir, every $every" "checkpoint.dir" "the run directory"
    intact "$work/parent" "checkpoint.dir $dir"
  done
done
check "a refused run writes no run directory" test ! -e parent/run

# ---- Two runs, one absolute checkpoint root: the second is refused, the first keeps its checkpoints. -----------
train a --set checkpoint.dir="$work/shared_root"
check "run a trains ($err)" test "$rc" = 0
check "run a's root is marked as a's" grep -q run_id shared_root/owner.json
a_id=$(python3 -c 'import json,sys; print(json.load(open("a/manifest.json"))["run_id"])')
check "run a's checkpoint names its run" grep -q "\"run_id\": \"$a_id\"" shared_root/step-00000004/manifest.json
before=$(ls shared_root)
for extra in "" "--overwrite" "--resume none --overwrite"; do
  # shellcheck disable=SC2086
  train b --set checkpoint.dir="$work/shared_root" $extra
  refused "second run on a's root ($extra)" "checkpoint.dir" "another run" "$a_id"
  check "a's checkpoints kept ($extra)" test "$(ls shared_root)" = "$before"
done

# ---- A sweep axis over checkpoint.dir: the cells whose root is the sweep (or above) or another cell's fail with
# exit 2; the sweep directory and the cell that owns the shared root keep everything. -----------------------------
sweep_small=()
for ((i = 0; i < ${#small[@]}; i += 2)); do [ "${small[i]}" = --set ] && sweep_small+=(--set "${small[i + 1]}"); done
"$moe" sweep --config "$config" "${sweep_small[@]}" --quiet \
  --grid "checkpoint.dir=$work/cell_root,../..,..,$work" --out sweep > sweep_out.txt 2>&1
check "the sweep ran its cells" test -s sweep/sweep.json
check "the sweep directory kept its plan" test -s sweep/sweep_plan.json
check "the cell with a root of its own kept its checkpoints" test -d cell_root/step-00000004
check "the cells with the sweep as their root wrote none there" test -z "$(ls -d sweep/step-* sweep/cells/step-* 2> /dev/null)"
failed_cells=$(python3 -c 'import json; print(sum(c.get("status") == "failed" for c in json.load(open("sweep/sweep.json"))["cells"]))')
check "three cells refused ($failed_cells)" test "$failed_cells" = 3

# ---- Run a again: a resume keeps its id; --overwrite starts a new run and deletes only what is the program's. ----
train a --set checkpoint.dir="$work/shared_root" --set train.steps=6
check "a resumes ($err)" test "$rc" = 0
check "a resume keeps the run id" grep -q "\"run_id\": \"$a_id\"" a/manifest.json
train a --set checkpoint.dir="$work/shared_root" --resume none --overwrite
check "a starts again ($err)" test "$rc" = 0
check "a fresh start is a new run" test "$(grep -c "\"run_id\": \"$a_id\"" a/manifest.json)" = 0
# A link planted where a checkpoint would be: the root is refused, the link's target untouched.
precious "$work/target"
ln -s "$work/target" shared_root/step-00000099
train a --set checkpoint.dir="$work/shared_root" --resume none --overwrite
refused "planted link in the root" "step-00000099"
intact "$work/target" "planted link"
rm shared_root/step-00000099

# ---- A checkpoint copied in from another run: passed over (said even with --quiet), unless named. -------------
train c
check "run c trains ($err)" test "$rc" = 0
cp -r shared_root/step-00000004 c/checkpoints/step-00000009
train c --set train.steps=6
resumed=$(python3 -c 'import json; print(json.loads(open("c/config_history.jsonl").readlines()[-1])["resumed_from"])')
check "c resumes its own newest, not the copy ($resumed; $err)" test "$resumed" = "c/checkpoints/step-00000004"
check "c says it passed over the copy, though --quiet" grep -qF "c/checkpoints/step-00000009: written by another run" err.txt
train d --resume "$work/shared_root/step-00000004" --set train.steps=6
check "a checkpoint named with --resume is taken ($err)" test "$rc" = 0

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
