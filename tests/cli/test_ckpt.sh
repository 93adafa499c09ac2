#!/usr/bin/env bash
# End-to-end tests of `moe ckpt ls|verify|info|export` on real checkpoints (docs/checkpoint.md): a small run
# with full and delta checkpoints is listed, verified, summarised and exported; the export of a delta
# checkpoint equals, value for value, the export of the same step saved as a full checkpoint by an identical
# run; the rank files carry their global coordinates as attributes; and bad input (a damaged checkpoint, a
# missing path, an existing --out) ends with exit code 2, a message naming the file, and nothing written.
#
# Usage: test_ckpt.sh MOE_BINARY SOURCE_DIR
set -u

if [ $# -ne 2 ]; then
  echo "usage: $0 MOE_BINARY SOURCE_DIR" >&2
  exit 2
fi
moe=$1
config="$2/configs/tiny_moe.json"
for tool in h5dump dd sha256sum jq mkfifo truncate timeout; do
  command -v "$tool" > /dev/null || { echo "$tool not found (hdf5-tools, coreutils, jq)" >&2; exit 1; }
done
unset OMPI_COMM_WORLD_SIZE PMI_SIZE PMIX_SIZE OMPI_COMM_WORLD_LOCAL_SIZE MPI_LOCALNRANKS

# A model small enough to train in about a second; checkpoints at steps 2 (full), 4 (delta), 6 (full).
small=(--set train.steps=6 --set model.d_model=32 --set model.layers=1 --set model.heads=2
       --set model.ffn_hidden=32 --set moe.num_experts=4 --set moe.expert_hidden=32 --set train.seq_len=16
       --set train.global_batch=2 --set train.micro_batch=1 --set train.eval_sequences=2 --set train.threads=1
       --set checkpoint.every=2 --quiet)

passed=0
failed=0
pass() { passed=$((passed + 1)); }
fail() {
  failed=$((failed + 1))
  echo "FAIL [$case_name] $1"
}

work=$(mktemp -d "${TMPDIR:-/tmp}/moe_ckpt_test.XXXXXX") || { echo "mktemp -d failed" >&2; exit 1; }
trap 'rm -rf "$work" "$work.before" "$work.stdout" "$work.stderr" "$work.big"' EXIT
cd "$work" || exit 1

# Every path under the working directory with its type, then every file's sha256.
snapshot() {
  find . -printf '%y %p\n' | LC_ALL=C sort
  find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum
}

# run_case NAME EXIT_CODE COMMAND...
# Runs COMMAND in $work; asserts its exit code, that stdout holds every string of `expect_out` and stderr every
# string of `expect_err`. With `unchanged=1`, also that the directory is the same byte for byte afterwards.
# COMMAND's output stays in $out and $err for further checks.
expect_out=()
expect_err=()
unchanged=0
out="$work.stdout"
err="$work.stderr"
run_case() {
  case_name=$1
  local want_rc=$2
  shift 2
  [ "$unchanged" = 1 ] && snapshot > "$work.before"
  "$@" > "$out" 2> "$err"
  local rc=$?
  if [ "$rc" = "$want_rc" ]; then pass; else fail "exit code $rc, expected $want_rc; stderr: $(cat "$err")"; fi
  local needle
  for needle in "${expect_out[@]}"; do
    if grep -qF -- "$needle" "$out"; then pass; else fail "stdout lacks '$needle'; stdout: $(cat "$out")"; fi
  done
  for needle in "${expect_err[@]}"; do
    if grep -qF -- "$needle" "$err"; then pass; else fail "stderr lacks '$needle'; stderr: $(cat "$err")"; fi
  done
  if [ "$unchanged" = 1 ]; then
    if diff <(snapshot) "$work.before" > /dev/null; then
      pass
    else
      fail "the directory changed (something was written or overwritten):"
      diff <(snapshot) "$work.before" | sed 's/^/    /'
    fi
  fi
  expect_out=()
  expect_err=()
  unchanged=0
}

# check NAME CONDITION...: one assertion outside run_case.
check() {
  case_name=$1
  shift
  if "$@"; then pass; else fail "assertion failed: $*"; fi
}

# Flips every bit of the byte in the middle of FILE.
flip_middle_byte() {
  local file=$1 size offset old
  size=$(stat -c %s "$file")
  offset=$((size / 2))
  old=$(dd if="$file" bs=1 skip="$offset" count=1 2> /dev/null | od -An -tu1 | tr -d ' ')
  # shellcheck disable=SC2059  # the format is the escaped byte on purpose
  printf "\\$(printf '%03o' $((old ^ 255)))" | dd of="$file" bs=1 seek="$offset" count=1 conv=notrunc 2> /dev/null
}

# ---- Two identical runs: A saves full, delta, full; B saves every checkpoint full. ------------------------------
case_name="setup"
if ! "$moe" train --config "$config" "${small[@]}" --set checkpoint.full_every=2 --run-dir A > /dev/null 2> setup.err \
  || ! "$moe" train --config "$config" "${small[@]}" --set checkpoint.full_every=1 --run-dir B > /dev/null 2>> setup.err
then
  echo "setup: the small training runs failed: $(cat setup.err)"
  echo "$passed passed, $((failed + 1)) failed"
  exit 1
fi
rm -f setup.err
ck=A/checkpoints

# ---- ls -------------------------------------------------------------------------------------------------------
expect_out=("latest -> step-00000006" "step-00000006" "step-00000004" "step-00000002" "delta, base step-00000002"
            "3 checkpoint(s), 3 verified")
unchanged=1
run_case "ls of a run directory" 0 "$moe" ckpt ls A
check "ls: newest first" test "$(grep -oE '^step-[0-9]+' "$out" | tr '\n' ' ')" = \
  "step-00000006 step-00000004 step-00000002 "
check "ls: every line verified" test "$(grep -c 'Z  verified' "$out")" = 3

expect_out=("step-00000004" "3 checkpoint(s)")
run_case "ls of a checkpoint root" 0 "$moe" ckpt ls "$ck"

expect_out=("step-00000004" "1 checkpoint(s), 1 verified")
run_case "ls of one checkpoint" 0 "$moe" ckpt ls "$ck/step-00000004"

# ---- verify ----------------------------------------------------------------------------------------------------
expect_out=("step-00000006" "Fletcher-32" "ok: ")
unchanged=1
run_case "verify of a run directory (its newest)" 0 "$moe" ckpt verify A

expect_out=("step-00000002/rank-00000.h5" "step-00000004/rank-00000.h5" "ok: ")
run_case "verify of a delta checks its chain" 0 "$moe" ckpt verify "$ck/step-00000004"

# ---- info ------------------------------------------------------------------------------------------------------
expect_out=("step        4" "delta, base step-00000002" "step-00000002 -> step-00000004" "model.d_model=32"
            "moe.num_experts=4" "params/embed.weight" "[256,32]" "optim/exp_avg/embed.weight" "optim/step"
            "moe/layers.0.ffn.balancing_bias" "clip/layers.0.ffn.experts.norm_ema" "xor delta")
unchanged=1
run_case "info of a delta checkpoint" 0 "$moe" ckpt info "$ck/step-00000004"

expect_out=("kind        full")
run_case "info of the same step saved full" 0 "$moe" ckpt info B/checkpoints/step-00000004

# ---- export ----------------------------------------------------------------------------------------------------
expect_out=("params/embed.weight" "wrote params4.h5")
run_case "export of a delta checkpoint" 0 "$moe" ckpt export "$ck/step-00000004" --out params4.h5
h5dump -H params4.h5 > header.txt 2>&1
check "export: params/embed.weight whole, 256 x d_model" \
  grep -qA2 'DATASET "embed.weight"' header.txt
check "export: params/embed.weight dims" \
  bash -c "grep -A2 'DATASET \"embed.weight\"' header.txt | grep -qF '( 256, 32 ) / ( 256, 32 )'"
check "export: experts whole" \
  bash -c "grep -A2 'DATASET \"layers.0.ffn.experts.w13\"' header.txt | grep -qF '( 4, 32, 2, 32 )'"
check "export: no optimizer state without --all" bash -c "! grep -q 'GROUP \"optim\"' header.txt"

# The delta's export equals the full checkpoint's of the same step, value for value, in every group.
expect_out=("wrote A4.h5")
run_case "export --all of a delta" 0 "$moe" ckpt export "$ck/step-00000004" --out A4.h5 --all
expect_out=("wrote B4.h5")
run_case "export --all of the same step saved full" 0 "$moe" ckpt export B/checkpoints/step-00000004 --out B4.h5 --all
for group in /params /optim /moe /clip; do
  h5dump -g "$group" A4.h5 | tail -n +2 > a.txt
  h5dump -g "$group" B4.h5 | tail -n +2 > b.txt
  check "export: $group of the delta equals the full" cmp -s a.txt b.txt
  check "export: $group holds data" test "$(wc -l < a.txt)" -gt 10
done
h5dump -d /params/embed.weight A4.h5 | tail -n +2 > a.txt
h5dump -d /params/embed.weight B4.h5 | tail -n +2 > b.txt
check "export: params/embed.weight of the delta equals the full" cmp -s a.txt b.txt
# Not vacuous: step 4's parameters differ from step 2's.
"$moe" ckpt export "$ck/step-00000002" --out A2.h5 > /dev/null 2>&1
h5dump -d /params/embed.weight A2.h5 | tail -n +2 > c.txt
check "export: step 2 differs from step 4" bash -c "! cmp -s a.txt c.txt"
check "export: the step counter is 4" bash -c "h5dump -d /optim/step A4.h5 | grep -qF '(0): 4'"
rm -f a.txt b.txt c.txt header.txt

h5dump -A "$ck/step-00000004/rank-00000.h5" > attrs.txt 2>&1
check "rank file: global_shape attribute" grep -qF 'ATTRIBUTE "global_shape"' attrs.txt
check "rank file: slab_start attribute" grep -qF 'ATTRIBUTE "slab_start"' attrs.txt
check "rank file: slab_shape attribute" grep -qF 'ATTRIBUTE "slab_shape"' attrs.txt
check "rank file: range attribute" grep -qF 'ATTRIBUTE "range"' attrs.txt
rm -f attrs.txt

expect_err=("params4.h5" "--force")
unchanged=1
run_case "export to an existing file" 2 "$moe" ckpt export "$ck/step-00000006" --out params4.h5

expect_out=("wrote params4.h5")
run_case "export --force replaces it" 0 "$moe" ckpt export "$ck/step-00000006" --out params4.h5 --force
check "export --force: step 6 now" bash -c "h5dump -A params4.h5 | grep -qF 'step-00000006'"

expect_err=("inside a checkpoint directory")
unchanged=1
run_case "export --force into a checkpoint directory" 2 \
  "$moe" ckpt export "$ck/step-00000006" --out "$ck/step-00000006/rank-00000.h5" --force

# ---- Damage ----------------------------------------------------------------------------------------------------
cp -r A D
flip_middle_byte D/checkpoints/step-00000006/rank-00000.h5
expect_err=("step-00000006/rank-00000.h5" "checksum")
unchanged=1
run_case "verify of a damaged checkpoint" 2 "$moe" ckpt verify D

expect_out=("NOT VERIFIED" "step-00000006/rank-00000.h5" "3 checkpoint(s), 2 verified")
run_case "ls shows the damaged checkpoint" 0 "$moe" ckpt ls D

expect_err=("step-00000006/rank-00000.h5")
unchanged=1
run_case "export of a damaged checkpoint" 2 "$moe" ckpt export D --out damaged.h5

# A damaged base breaks the delta on top of it.
cp -r A E
flip_middle_byte E/checkpoints/step-00000002/rank-00000.h5
expect_err=("step-00000002/rank-00000.h5")
unchanged=1
run_case "verify of a delta whose base is damaged" 2 "$moe" ckpt verify E/checkpoints/step-00000004
rm -rf D E

# ---- Forged checkpoints: each refused by verify (exit 2), marked by ls, refused by --resume PATH ----------------
# (tests/launch/test_checkpoint_damage.cpp rewrites shards with recomputed checksums and checks the fallback
# of --resume auto; here the program itself, from the outside.)
# forge NAME JQ_FILTER: a copy of A whose step-6 manifest is rewritten by JQ_FILTER.
forge() {
  rm -rf G && cp -r A G
  jq "$1" G/checkpoints/step-00000006/manifest.json > manifest.tmp && mv manifest.tmp G/checkpoints/step-00000006/manifest.json
}
g6=G/checkpoints/step-00000006
embed='(.files[0].datasets[] | select(.tensor == "params/embed.weight"))'
for attack in \
    '.step = 8 :: step 8, but the directory is step-00000006' \
    "$embed.global_shape = [32,256] | $embed.shape = [32,256] :: the file holds f32 x 8192 at [0:256, 0:32] of [256,32]" \
    "$embed.dtype = \"f64\" :: the file holds f32" \
    '.files[0].name = "../../etc/passwd" :: points outside the checkpoint directory' \
    '.files[0].name = "/etc/passwd" :: points outside the checkpoint directory' \
    '.kind = "delta" :: kind delta with a chain of 1' \
    '.chain = ["step-00000002"] :: its chain does not end in its own directory'; do
  filter=${attack%% :: *}
  reason=${attack#* :: }
  forge "$filter"
  expect_err=("$reason")
  unchanged=1
  run_case "verify of a forged manifest ($filter)" 2 "$moe" ckpt verify "$g6"
  expect_out=("NOT VERIFIED: " "$reason" "3 checkpoint(s), 2 verified")
  run_case "ls of a forged manifest ($filter)" 0 "$moe" ckpt ls G
  expect_err=("--resume $g6" "$reason")
  run_case "resume PATH of a forged manifest ($filter)" 2 \
    "$moe" train --config "$config" "${small[@]}" --set checkpoint.full_every=2 --run-dir G --resume "$g6"
done

# A symlink to a 20 GiB sparse file in place of a shard: refused at once, without reading it.
rm -rf G && cp -r A G
truncate -s 20G "$work.big"
rm "$g6/rank-00000.h5" && ln -s "$work.big" "$g6/rank-00000.h5"
expect_err=("rank-00000.h5" "a symbolic link, not a regular file")
unchanged=1
started=$(date +%s)
run_case "verify of a symlink to a 20 GiB sparse file" 2 timeout 20 "$moe" ckpt verify "$g6"
check "verify of a symlink to a 20 GiB sparse file: within 5 s" test $(($(date +%s) - started)) -le 5
expect_out=("NOT VERIFIED: " "a symbolic link" "3 checkpoint(s), 2 verified")
run_case "ls of a symlink to a 20 GiB sparse file" 0 timeout 20 "$moe" ckpt ls G
rm -f "$work.big"

# A FIFO in place of a shard, then of the manifest: nothing hangs.
for victim in rank-00000.h5 manifest.json; do
  rm -rf G && cp -r A G
  rm "$g6/$victim" && mkfifo "$g6/$victim"
  expect_err=("$victim" "not a regular file")
  unchanged=1
  run_case "verify of a FIFO in place of $victim" 2 timeout 20 "$moe" ckpt verify "$g6"
  expect_out=("NOT VERIFIED: " "$victim" "3 checkpoint(s), 2 verified")
  run_case "ls of a FIFO in place of $victim" 0 timeout 20 "$moe" ckpt ls G
  expect_err=("--resume $g6" "not a regular file")
  run_case "resume PATH of a FIFO in place of $victim" 2 timeout 20 \
    "$moe" train --config "$config" "${small[@]}" --set checkpoint.full_every=2 --run-dir G --resume "$g6"
done
rm -rf G

# ---- export to a place it cannot write: refused before anything is written -------------------------------------
expect_err=("afile2" "is not a directory")
printf 'x\n' > afile2
unchanged=1
run_case "export under a regular file" 2 "$moe" ckpt export A --out afile2/x.h5
expect_err=("missing-dir" "does not exist")
unchanged=1
run_case "export into a missing directory" 2 "$moe" ckpt export A --out missing-dir/x.h5
if [ "$(id -u)" = 0 ]; then readonly_out=/proc/moe_ckpt_export_test.h5; else mkdir ro && chmod 555 ro && readonly_out=ro/x.h5; fi
expect_err=("$readonly_out")
unchanged=1
run_case "export into a read-only location" 2 "$moe" ckpt export A --out "$readonly_out"
check "export into a read-only location: no file" test ! -e "$readonly_out"
rm -rf afile2 ro 2> /dev/null || { chmod 755 ro; rm -rf ro; }

# ---- Two ranks with peer copies: a damaged rank file is read from its copy, and verify says so. ------------------
mpirun=(mpirun --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 --timeout 60)
[ "$(id -u)" = 0 ] && mpirun+=(--allow-run-as-root)
case_name="setup: two ranks"
if "${mpirun[@]}" -np 2 "$moe" train --config "$config" "${small[@]}" --set parallel.ep=2 \
     --set checkpoint.peer_copy=true --set checkpoint.full_every=2 --run-dir P > /dev/null 2> setup.err; then
  pass
  expect_out=("rank-00000.h5" "rank-00001.h5" "peer copy of rank 1" "ok: ")
  run_case "verify of a two-rank checkpoint with peer copies" 0 "$moe" ckpt verify P/checkpoints/step-00000004
  expect_out=("[4,32,32]" "a copy of rank 1's file")
  run_case "info of a two-rank checkpoint" 0 "$moe" ckpt info P
  check "info: expert weights in 2 files" grep -qE 'params/layers.0.ffn.experts.w13 +\[4,32,2,32\] +f32 +8192 +2 +2 ' "$out"

  flip_middle_byte P/checkpoints/step-00000006/rank-00001.h5
  expect_err=("step-00000006/rank-00001.h5" "peer-of-rank-00001.h5" "lost the redundancy")
  unchanged=1
  run_case "verify of a rank file that only its peer copy saves" 2 "$moe" ckpt verify P
  expect_out=("verified through a copy" "peer-of-rank-00001.h5")
  run_case "ls of a rank file that only its peer copy saves" 0 "$moe" ckpt ls P
  expect_out=("peer-of-rank-00001.h5" "wrote P6.h5")
  run_case "export reads the peer copy" 0 "$moe" ckpt export P --out P6.h5
  "$moe" ckpt export A --out A6.h5 > /dev/null 2>&1
  h5dump -g /params A6.h5 | tail -n +2 > a.txt
  h5dump -g /params P6.h5 | tail -n +2 > b.txt
  # Two ranks sum the gradients in another order; the values agree to fp32 rounding, the shapes exactly.
  check "export of two ranks: same datasets and shapes as one rank" \
    cmp -s <(grep -E 'DATASET|DATASPACE' a.txt) <(grep -E 'DATASET|DATASPACE' b.txt)
  rm -f a.txt b.txt A6.h5 P6.h5
else
  fail "the two-rank run failed: $(cat setup.err)"
fi
rm -rf P setup.err

# ---- A checkpoint of the first format (tests/fixtures/checkpoint-v1, see its README) ---------------------------
# Listed, verified, summarised and exported by this program as the program that wrote it exported it, and
# resumed from by a run of another layout (one rank, ep 1, where it was written by two ranks with ep 2).
cp -r "$2/tests/fixtures/checkpoint-v1" V1
check "the moe-checkpoint-1 fixture is as it was written" bash -c "cd V1 && sha256sum --quiet -c SHA256SUMS"
expect_out=("step-00000004" "step-00000002" "2 checkpoint(s), 2 verified")
run_case "ls of a moe-checkpoint-1 root" 0 "$moe" ckpt ls V1/checkpoints
expect_out=("ok: " "rank-00000.h5" "rank-00001.h5" "(2 checkpoint(s) in its chain")
unchanged=1
run_case "verify of a moe-checkpoint-1 delta" 0 "$moe" ckpt verify V1/checkpoints/step-00000004
expect_out=("format      moe-checkpoint-1" "step        4")
run_case "info of a moe-checkpoint-1 checkpoint" 0 "$moe" ckpt info V1/checkpoints
check "info: v1 expert weights in 2 files" grep -qE 'params/layers.0.ffn.experts.w1 +\[2,8,8\] +f32 +128 +2 +2 ' "$out"
expect_out=("wrote v1.h5: 44 tensors")
run_case "export of a moe-checkpoint-1 delta" 0 "$moe" ckpt export V1/checkpoints --all --out v1.h5
for group in clip moe optim params; do
  check "export of a moe-checkpoint-1 delta: /$group as its writer exported it" \
    cmp -s <(h5dump -g "/$group" v1.h5 | tail -n +2) <(h5dump -g "/$group" V1/export-step4.h5 | tail -n +2)
done
v1_config=(--config V1/config.json --set parallel.ep=1 --set train.steps=6 --quiet)
run_case "resume from a moe-checkpoint-1 checkpoint under another layout" 0 \
  "$moe" train "${v1_config[@]}" --run-dir V1run --resume V1/checkpoints/step-00000004
expect_out=("step-00000006" "1 checkpoint(s), 1 verified")
run_case "ls of the run resumed from moe-checkpoint-1" 0 "$moe" ckpt ls V1run
check "the resumed run writes moe-checkpoint-2" \
  bash -c "jq -r .format V1run/checkpoints/step-00000006/manifest.json | grep -qx moe-checkpoint-2"
rm -rf V1 V1run v1.h5

# ---- Paths that are not checkpoints ------------------------------------------------------------------------------
for action in ls verify info export; do
  extra=()
  [ "$action" = export ] && extra=(--out missing.h5)
  expect_err=("nope")
  unchanged=1
  run_case "$action of a missing path" 2 "$moe" ckpt "$action" nope "${extra[@]}"
done

mkdir empty && printf 'x\n' > afile
expect_err=("empty" "not a run directory")
unchanged=1
run_case "verify of a directory that is no run" 2 "$moe" ckpt verify empty

expect_err=("afile" "not a directory")
unchanged=1
run_case "info of a regular file" 2 "$moe" ckpt info afile

mkdir -p F/checkpoints/tmp-step-00000008
expect_err=("tmp-step-00000008" "manifest.json")
unchanged=1
run_case "verify of an uncommitted checkpoint" 2 "$moe" ckpt verify F/checkpoints/tmp-step-00000008

# ---- Help ------------------------------------------------------------------------------------------------------
expect_out=("ls" "verify" "info" "export")
run_case "moe ckpt --help" 0 "$moe" ckpt --help
expect_out=("--out" "--all" "--force")
run_case "moe ckpt export --help" 0 "$moe" ckpt export --help

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
