#!/usr/bin/env bash
# End-to-end tests of the `moe` command line: every kind of bad input ends with exit code 2, a message on
# stderr naming the problem (the key, file or value), and nothing written or overwritten (DESIGN.md,
# invariant 5; CONTRACT.md, exit codes). Also that --help works. What a successful run writes, and how it
# trains, is tests/launch/test_trainer.cpp's business.
#
# Usage: test_bad_input.sh MOE_BINARY SOURCE_DIR
# Each case runs in a fresh directory (its working directory, so a default run dir would land there too);
# "nothing written" means that directory's tree, with every file's sha256, is the same after as before.
set -u

if [ $# -ne 2 ]; then
  echo "usage: $0 MOE_BINARY SOURCE_DIR" >&2
  exit 2
fi
moe=$1
config="$2/configs/tiny.json"
# A launcher's environment would make every case a multi-rank refusal; the one case that wants it sets it.
unset OMPI_COMM_WORLD_SIZE PMI_SIZE PMIX_SIZE OMPI_COMM_WORLD_LOCAL_SIZE MPI_LOCALNRANKS

# A model small enough that a run that is (wrongly) allowed to train ends in well under a second.
small=(--set train.steps=2 --set model.d_model=32 --set model.layers=1 --set model.heads=2
       --set model.ffn_hidden=32 --set train.seq_len=16 --set train.global_batch=2 --set train.micro_batch=1
       --set train.eval_sequences=2 --set train.threads=1 --quiet)

passed=0
failed=0
pass() { passed=$((passed + 1)); }
fail() {
  failed=$((failed + 1))
  echo "FAIL [$case_name] $1"
}

# Every path under the working directory with its type, then every file's sha256.
snapshot() {
  find . -printf '%y %p\n' | LC_ALL=C sort
  find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum
}

# run_case NAME EXIT_CODE SETUP COMMAND...
# In a fresh directory: runs SETUP (a function), runs COMMAND, and asserts its exit code, that stderr holds
# every string of the array `expect`, and that the directory is unchanged byte for byte. The snapshot and
# COMMAND's output go beside the directory, not into it.
expect=()
run_case() {
  case_name=$1
  local want_rc=$2 setup=$3
  shift 3
  local dir
  dir=$(mktemp -d "${TMPDIR:-/tmp}/moe_cli_test.XXXXXX") || { fail "mktemp -d failed"; return; }
  (
    cd "$dir" || exit 1
    "$setup" || exit 1
    snapshot > "$dir.before"
    "$@" > "$dir.stdout" 2> "$dir.stderr"
    echo $? > "$dir.rc"
  )
  if [ ! -f "$dir.rc" ]; then
    fail "setup failed"
  else
    local rc stderr
    rc=$(cat "$dir.rc")
    stderr=$(cat "$dir.stderr")
    if [ "$rc" = "$want_rc" ]; then pass; else fail "exit code $rc, expected $want_rc; stderr: $stderr"; fi
    local needle
    for needle in "${expect[@]}"; do
      if [[ "$stderr" == *"$needle"* ]]; then pass; else fail "stderr lacks '$needle'; stderr: $stderr"; fi
    done
    if diff <(cd "$dir" && snapshot) "$dir.before" > /dev/null; then
      pass
    else
      fail "the directory changed (something was written or overwritten):"
      diff <(cd "$dir" && snapshot) "$dir.before" | sed 's/^/    /'
    fi
  fi
  rm -rf "$dir" "$dir.before" "$dir.stdout" "$dir.stderr" "$dir.rc"
  expect=()
}

# ---- Setups: each runs in the case's directory. -------------------------------------------------------------
no_setup() { :; }
write_malformed_json() {
  # The stray comma on line 3 is the error.
  printf '{\n  "train": {"steps": 2},\n  "model": {"d_model": 32,}\n}\n' > bad.json
}
write_unknown_key() { printf '{"train": {"stepz": 5}}\n' > typo.json; }
write_wrong_type() { printf '{"train": {"steps": "5"}}\n' > strings.json; }
write_short_source() { printf 'too short' > short.txt; }
make_regular_file() { printf 'not a run directory\n' > afile; }
# A finished run in ./run: what the next command must leave alone.
previous_run() {
  if ! "$moe" train --config "$config" "${small[@]}" --run-dir run > /dev/null 2> setup_stderr.txt \
    || [ ! -f run/config.json ] || [ ! -f run/manifest.json ] || [ ! -s run/metrics.jsonl ]; then
    echo "setup: the small training run failed: $(cat setup_stderr.txt)"
    return 1
  fi
  rm -f setup_stderr.txt
}

# ---- The command line (CLI11). ---------------------------------------------------------------------------------
expect=("subcommand")
run_case "no subcommand" 2 no_setup "$moe"

expect=("frobnicate")
run_case "unknown subcommand" 2 no_setup "$moe" frobnicate --config "$config"

expect=("--bogus")
run_case "unknown option" 2 no_setup "$moe" train --config "$config" --bogus

expect=("--config")
run_case "missing --config" 2 no_setup "$moe" train "${small[@]}"

expect=("nope.json")
run_case "nonexistent config file" 2 no_setup "$moe" train --config nope.json "${small[@]}"

# ---- The config: file and --set. ------------------------------------------------------------------------------
expect=("bad.json" "line 3")
run_case "malformed JSON" 2 write_malformed_json "$moe" train --config bad.json "${small[@]}"

expect=("train.stepz" "train.steps")
run_case "unknown key" 2 write_unknown_key "$moe" train --config typo.json "${small[@]}"

expect=("train.steps" '"5"' "integer")
run_case "wrong type" 2 write_wrong_type "$moe" train --config strings.json "${small[@]}"

expect=("optim.lr" "-1" "> 0")
run_case "out-of-range value" 2 no_setup "$moe" train --config "$config" "${small[@]}" --set optim.lr=-1

expect=("train.steps" "KEY=VALUE")
run_case "--set without '='" 2 no_setup "$moe" train --config "$config" "${small[@]}" --set train.steps

expect=("model.dmodel" "model.d_model")
run_case "--set of an unknown key" 2 no_setup "$moe" train --config "$config" "${small[@]}" --set model.dmodel=32

expect=("model.d_model = 34" "model.heads = 4")
run_case "d_model not a multiple of heads" 2 no_setup \
  "$moe" train --config "$config" "${small[@]}" --set model.d_model=34 --set model.heads=4

# ---- Data. ------------------------------------------------------------------------------------------------------
expect=("missing.txt")
run_case "data source file missing" 2 no_setup "$moe" train --config "$config" "${small[@]}" \
  --set 'data.sources=[{"name": "prose", "path": "missing.txt"}]' --run-dir run

expect=("short.txt" "seq_len")
run_case "data source shorter than seq_len" 2 write_short_source "$moe" train --config "$config" "${small[@]}" \
  --set 'data.sources=[{"name": "prose", "path": "short.txt"}]' --run-dir run

# ---- What this build cannot do yet. --------------------------------------------------------------------------
# A world size that does not fit the config: refused on every rank (mpirun's exit code is 2), no hang.
mpirun=(mpirun --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 --timeout 60)
[ "$(id -u)" = 0 ] && mpirun+=(--allow-run-as-root)
expect=("parallel.tp * parallel.pp * parallel.dp = 1 * 1 * 2" "world size is 3")
run_case "world size that does not fit" 2 no_setup \
  "${mpirun[@]}" -np 3 "$moe" train --config "$config" "${small[@]}" --set parallel.dp=2 --run-dir run
expect=("parallel.ep" "moe.num_experts")
run_case "ep that does not divide the experts" 2 no_setup \
  "${mpirun[@]}" -np 3 "$moe" train --config "$config" "${small[@]}" --set moe.num_experts=4 --set parallel.ep=3 \
  --run-dir run

expect=("checkpoint.every")
run_case "checkpoint.every=-1" 2 no_setup "$moe" train --config "$config" "${small[@]}" --set checkpoint.every=-1 \
  --run-dir run

expect=("some/path")
run_case "--resume PATH" 2 no_setup "$moe" train --config "$config" "${small[@]}" --resume some/path --run-dir run

# ---- The run directory. ----------------------------------------------------------------------------------------
expect=("run" "--overwrite")
run_case "run dir holds a run" 2 previous_run "$moe" train --config "$config" "${small[@]}" --run-dir run

expect=("model.dmodel")
run_case "bad config, run dir holds a run" 2 previous_run \
  "$moe" train --config "$config" "${small[@]}" --set model.dmodel=32 --run-dir run --overwrite

expect=("afile" "not a directory")
run_case "--run-dir is a regular file" 2 make_regular_file \
  "$moe" train --config "$config" "${small[@]}" --run-dir afile

# The parent is a file, so the run directory can never be created: a command-line mistake, not an internal error.
expect=("afile/run")
run_case "--run-dir under a regular file" 2 make_regular_file \
  "$moe" train --config "$config" "${small[@]}" --run-dir afile/run

# ---- Help. ------------------------------------------------------------------------------------------------------
for help in "--help" "train --help"; do
  case_name="moe $help"
  # shellcheck disable=SC2086  # $help is two words on purpose
  out=$("$moe" $help 2>&1)
  rc=$?
  if [ "$rc" = 0 ]; then pass; else fail "exit code $rc, expected 0"; fi
  for needle in "--config" "--set"; do
    if [[ "$out" == *"$needle"* ]]; then pass; else fail "help lacks '$needle'; it says: $out"; fi
  done
done

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
