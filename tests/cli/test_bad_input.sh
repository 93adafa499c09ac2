#!/usr/bin/env bash
# End-to-end tests of the `moe` command line: every kind of bad input ends with exit code 2, a message on
# stderr naming the problem (the key, file or value), and nothing written or overwritten (docs/design.md,
# invariant 5; docs/cli.md, exit codes). Also that --help works. What a successful run writes, and how it
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
make_fifo() { mkfifo fifo; }
# 100,000 nested brackets: a parser that built (or printed) the tree would exhaust memory or the stack.
write_deep_json() { python3 -c "print('[' * 100000 + ']' * 100000)" > deep.json; }
# 20 MB of zero bytes (sparse): over the 16 MiB limit, refused before a byte of it is read.
write_big_json() { truncate -s 20M big.json; }
make_dir_ro() { mkdir ro; }
make_dir_locked() { mkdir locked && chmod 555 locked; }
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

# ---- What is parsed is bounded: the kind of file, its size, its nesting; the same for --set values. ----------
expect=("/dev/zero" "character device" "regular JSON file")
run_case "--config /dev/zero" 2 no_setup "$moe" train --config /dev/zero "${small[@]}"

# Nobody writes to the FIFO: a program that opened it for a blocking read would hang until the test's timeout.
expect=("fifo" "FIFO" "regular JSON file")
run_case "--config a FIFO" 2 make_fifo timeout 20 "$moe" train --config fifo "${small[@]}"

expect=("deep.json" "more than 64 levels")
run_case "100,000 nested brackets" 2 write_deep_json "$moe" train --config deep.json "${small[@]}"

expect=("big.json" "20971520 bytes" "16777216")
run_case "a 20 MB config" 2 write_big_json "$moe" train --config big.json "${small[@]}"

# 60,000 levels: as deep as one command-line argument can hold.
deep_value=$(python3 -c "print('[' * 60000 + ']' * 60000)")
expect=("--set train.steps=[[[" "more than 64 levels")
run_case "--set of 60,000 nested brackets" 2 no_setup "$moe" train --config "$config" "${small[@]}" \
  --set "train.steps=$deep_value"

# ---- Routing techniques and latent attention (docs/moe.md): their values and rules, by key. ----
expect=("moe.overflow" '["dense","reroute"]' "reroutes first")
run_case "an overflow cascade that does not reroute first" 2 no_setup "$moe" train --config "$config" "${small[@]}" \
  --set 'moe.overflow=["dense", "reroute"]'

expect=("moe.capacity_factor = 0" "moe.capacity_auto.enabled = true")
run_case "adaptive capacity without a capacity limit" 2 no_setup "$moe" train --config "$config" "${small[@]}" \
  --set moe.capacity_auto.enabled=true --set moe.capacity_factor=0

expect=("model.attention" "parallel.tp = 2")
run_case "latent attention over tensor-parallel ranks" 2 no_setup "$moe" train --config "$config" "${small[@]}" \
  --set model.attention=mla --set parallel.tp=2

# ---- Limits of the code: each a range or rule of the schema, refused by key before anything is written. ----
expect=("moe.num_experts = 2048" "<= 1024")
run_case "moe.num_experts past the router's limit" 2 no_setup "$moe" train --config "$config" "${small[@]}" \
  --set moe.num_experts=2048

expect=("moe.top_k = 1025" "<= 1024")
run_case "moe.top_k past the router's limit" 2 no_setup "$moe" train --config "$config" "${small[@]}" \
  --set moe.num_experts=1024 --set moe.top_k=1025

expect=("moe.top_k = 9" "moe.num_experts = 8")
run_case "moe.top_k above moe.num_experts" 2 no_setup "$moe" train --config "$config" "${small[@]}" \
  --set moe.num_experts=8 --set moe.top_k=9

expect=("train.recompute_layers = 2" "model.layers = 1")
run_case "train.recompute_layers above model.layers" 2 no_setup "$moe" train --config "$config" "${small[@]}" \
  --set train.recompute=selective --set train.recompute_layers=2

expect=("train.steps = 100000000" "<= 99999999")
run_case "train.steps past the checkpoint names' digits" 2 no_setup "$moe" train --config "$config" "${small[@]}" \
  --set train.steps=100000000

expect=("train.threads = 4294967297" "<= 2147483647")
run_case "train.threads past an int" 2 no_setup "$moe" train --config "$config" "${small[@]}" \
  --set train.threads=4294967297

expect=("model.vocab = 2147483648" "<= 2147483647")
run_case "model.vocab past 32-bit tokens" 2 no_setup "$moe" train --config "$config" "${small[@]}" \
  --set model.vocab=2147483648

expect=("fault.heartbeat_interval_s = 1e+300" "in [0.001, 60]")
run_case "fault.heartbeat_interval_s past a minute" 2 no_setup "$moe" train --config "$config" "${small[@]}" \
  --set fault.heartbeat_interval_s=1e300

expect=("fault.heartbeat_interval_s = 40" "fault.heartbeat_timeout_s = 30")
run_case "heartbeat interval not below its timeout" 2 no_setup "$moe" train --config "$config" "${small[@]}" \
  --set fault.heartbeat_interval_s=40

expect=("data.sources[1].weight" "sum is finite")
run_case "source weights summing past a double" 2 no_setup "$moe" train --config "$config" "${small[@]}" \
  --set 'data.sources=[{"name": "a", "path": "a.txt", "weight": 1e308}, {"name": "b", "path": "b.txt", "weight": 1e308}]'

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

# The CUDA backend where there is no device (or no CUDA backend in the build): named, before anything is written.
expect=('train.device = "cuda"')
run_case "train.device cuda without a device" 2 no_setup "$moe" train --config "$config" "${small[@]}" \
  --set train.device=cuda --run-dir run
expect=("train.device" "cpu" "cuda")
run_case "train.device that is no backend" 2 no_setup "$moe" train --config "$config" "${small[@]}" \
  --set train.device=tpu --run-dir run

# Pipeline parallelism: a step needs at least one micro-batch per stage on every data-parallel rank.
expect=("train.global_batch = 2" "1 micro-batch" "parallel.pp = 4" "raise train.global_batch to 8")
run_case "fewer micro-batches than pipeline stages" 2 no_setup \
  "${mpirun[@]}" -np 4 "$moe" train --config "$config" "${small[@]}" --set model.layers=4 --set parallel.pp=4 \
  --set train.global_batch=2 --set train.micro_batch=2 --run-dir run

# Interleaved stages: the schedule runs each data-parallel rank's micro-batches in groups of one per stage
# (refused once the data-parallel size is known: here dp 2 leaves 3 each), and chunks need pipeline stages.
expect=("parallel.vpp = 2" "3 micro-batches" "data-parallel size 2" "multiple of parallel.pp = 2")
run_case "interleaved micro-batches not a multiple of the stages" 2 no_setup \
  "${mpirun[@]}" -np 4 "$moe" train --config "$config" "${small[@]}" --set model.layers=4 --set parallel.pp=2 \
  --set parallel.vpp=2 --set parallel.pp_schedule=interleaved_1f1b --set train.global_batch=12 \
  --set train.micro_batch=2 --run-dir run
expect=("parallel.vpp = 2" "parallel.pp = 1 (default)" "parallel.pp >= 2")
run_case "chunks without pipeline stages" 2 no_setup "$moe" train --config "$config" "${small[@]}" \
  --set parallel.vpp=2 --set parallel.pp_schedule=interleaved_1f1b --run-dir run

# Tensor parallelism: an uneven split is named.
expect=("model.heads = 2" "parallel.tp = 4" "attention heads")
run_case "model.heads not a multiple of parallel.tp" 2 no_setup "$moe" train --config "$config" "${small[@]}" \
  --set parallel.tp=4
expect=("train.seq_len = 15" "parallel.tp = 2" "parallel.sequence_parallel = true")
run_case "train.seq_len not a multiple of parallel.tp" 2 no_setup "$moe" train --config "$config" "${small[@]}" \
  --set parallel.tp=2 --set train.seq_len=15
expect=("parallel.expert_tp = 3" "parallel.tp = 2" "expected 1")
run_case "parallel.expert_tp neither 1 nor parallel.tp" 2 no_setup "$moe" train --config "$config" "${small[@]}" \
  --set parallel.tp=2 --set parallel.expert_tp=3
expect=("moe.fallback_hidden = 63" "parallel.tp = 2" "dense fallback")
run_case "moe.fallback_hidden not a multiple of parallel.tp with parallel.expert_tp" 2 no_setup "$moe" train \
  --config "$config" "${small[@]}" --set moe.num_experts=4 --set parallel.tp=2 --set parallel.expert_tp=2 \
  --set moe.overflow=dense --set moe.fallback_hidden=63

# The memory estimate: a model no machine holds is refused by name before anything is allocated or written.
expect=("per rank" "model.d_model=65536" "model.layers=64" "more than this machine")
run_case "a model no machine holds" 2 no_setup "$moe" train --config "$config" "${small[@]}" \
  --set model.d_model=65536 --set model.layers=64 --run-dir run

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

expect=("afile/a/b" "afile is not a directory")
run_case "--run-dir two levels under a regular file" 2 make_regular_file \
  "$moe" train --config "$config" "${small[@]}" --run-dir afile/a/b

long_name=$(printf 'n%.0s' $(seq 300))
expect=("300 characters" "at most 255")
run_case "--run-dir with a 300-character name" 2 no_setup \
  "$moe" train --config "$config" "${small[@]}" --run-dir "run/$long_name"

# Names the run records as JSON must be UTF-8: refused before anything is written, naming the option.
expect=("--run-dir" "not valid UTF-8")
run_case "--run-dir that is not UTF-8" 2 no_setup \
  "$moe" train --config "$config" "${small[@]}" --run-dir "$(printf 'run\xff')"
expect=("--set \"checkpoint.dir\"" "not valid UTF-8")
run_case "a --set value that is not UTF-8" 2 no_setup \
  "$moe" train --config "$config" "${small[@]}" --set "checkpoint.dir=$(printf 'c\xc3')"
expect=("moe.router.tau" "float32")
run_case "a temperature beyond float32" 2 no_setup \
  "$moe" train --config "$config" "${small[@]}" --set moe.router.tau=1e308

# A read-only file system refuses root too: a tmpfs mounted read-only in a mount namespace of the command's
# own (nothing to unmount afterwards). Where mounting is not permitted, a directory without write
# permission does for any other user; as root without mounts, the case cannot be made here.
if [ "$(id -u)" = 0 ] && unshare -m sh -c 'mount -t tmpfs -o ro,size=1m tmpfs /mnt' 2> /dev/null; then
  expect=("--run-dir ro/run" "read-only file system")
  run_case "--run-dir on a read-only file system" 2 make_dir_ro unshare -m sh -c \
    'mount -t tmpfs -o ro,size=1m tmpfs ro && exec "$@"' sh "$moe" train --config "$config" "${small[@]}" --run-dir ro/run
elif [ "$(id -u)" != 0 ]; then
  expect=("--run-dir locked/run" "not writable")
  run_case "--run-dir in a directory without write permission" 2 make_dir_locked \
    "$moe" train --config "$config" "${small[@]}" --run-dir locked/run
else
  echo "SKIP [--run-dir on a read-only file system]: cannot mount here"
fi

# ---- moe prep, and prepared data. ----------------------------------------------------------------------------
write_text() { printf 'some text to prepare\n' > a.txt; }
write_text_and_out() { write_text && mkdir out && printf 'keep me\n' > out/file; }
write_bad_jsonl() { printf '{"text": "fine"}\n{"body": "no text"}\n' > docs.jsonl; }
write_cut_gzip() { printf '{"text": "some words here"}\n' | gzip -c | head -c 20 > docs.jsonl.gz; }
# A prepared directory with one byte of a shard flipped.
damaged_prepared() {
  for i in $(seq 1 200); do echo "line $i of a text that is long enough to train a tiny model on"; done > a.txt
  "$moe" prep --input a=a.txt --out prepared --tokenizer byte --quiet > /dev/null || return 1
  printf 'Z' | dd of=prepared/a.t1.00000.bin bs=1 seek=7 conv=notrunc 2> /dev/null
}

expect=("missing.txt" "no such file")
run_case "prep: missing input" 2 no_setup "$moe" prep --input missing.txt --out out --quiet

expect=("--out out exists" "overwrites nothing")
run_case "prep: --out exists" 2 write_text_and_out "$moe" prep --input a.txt --out out --quiet

expect=("--vocab 100" ">= 257")
run_case "prep: vocabulary too small" 2 write_text "$moe" prep --input a.txt --out out --vocab 100 --quiet

expect=("--tier-weights" "one per tier")
run_case "prep: tier weights do not fit" 2 write_text "$moe" prep --input a.txt --out out --tier-weights 1,2 --quiet

expect=("docs.jsonl:2" '"text"')
run_case "prep: JSON Lines without text" 2 write_bad_jsonl "$moe" prep --input docs.jsonl --out out --quiet

expect=("docs.jsonl.gz" "truncated")
run_case "prep: truncated gzip" 2 write_cut_gzip "$moe" prep --input docs.jsonl.gz --out out --quiet

expect=("prepared" "a.t1.00000.bin" "xxh64" "damaged")
run_case "train on a damaged prepared shard" 2 damaged_prepared "$moe" train --config "$config" "${small[@]}" \
  --set model.vocab=257 --set 'data.sources=[{"name": "a", "path": "prepared"}]' --run-dir run

# ---- moe sweep: every refusal before any cell runs or anything is written. -----------------------------------
grid=(--grid moe.router.tau=0.5,1.0 --grid moe.capacity_factor=1.0,2.0)
sweep_sets=(--set train.steps=2 --set model.d_model=32 --set model.layers=1 --set model.heads=2
            --set model.ffn_hidden=32 --set train.seq_len=16 --set train.global_batch=2 --set train.micro_batch=1
            --set train.eval_sequences=2 --set train.threads=1)
moe_config="$2/configs/tiny_moe.json"
# A sweep directory of another grid: its plan must be left as it is.
other_sweep() { mkdir sw && printf '{"grid": [], "seeds": [1], "np": 1, "base": {}}\n' > sw/sweep_plan.json; }
not_a_sweep() { mkdir sw && printf 'mine\n' > sw/notes.txt; }

expect=("--grid" "moe.router.tua" "moe.router.tau")
run_case "sweep: unknown grid key" 2 no_setup "$moe" sweep --config "$moe_config" "${sweep_sets[@]}" \
  --grid moe.router.tua=0.5,1.0 --out sw

expect=("--grid" "moe.router.tau" "abc" "number")
run_case "sweep: grid value of the wrong type" 2 no_setup "$moe" sweep --config "$moe_config" "${sweep_sets[@]}" \
  --grid moe.router.tau=0.5,abc --out sw

expect=("moe.router.tau" "-1" "> 0")
run_case "sweep: grid value out of range" 2 no_setup "$moe" sweep --config "$moe_config" "${sweep_sets[@]}" \
  --grid moe.router.tau=-1,1 --out sw

expect=("--grid" "empty value")
run_case "sweep: empty grid value" 2 no_setup "$moe" sweep --config "$moe_config" "${sweep_sets[@]}" \
  --grid moe.router.tau=0.5,,1 --out sw

expect=("--grid" "KEY=V1,V2")
run_case "sweep: grid without '='" 2 no_setup "$moe" sweep --config "$moe_config" "${sweep_sets[@]}" \
  --grid moe.router.tau --out sw

expect=("moe.router.tau" "another --grid")
run_case "sweep: a key in two grids" 2 no_setup "$moe" sweep --config "$moe_config" "${sweep_sets[@]}" \
  --grid moe.router.tau=0.5 --grid moe.router.tau=1.0 --out sw

expect=("cell" "moe.top_k" "moe.num_experts")
run_case "sweep: a cell whose config breaks a rule" 2 no_setup "$moe" sweep --config "$moe_config" \
  "${sweep_sets[@]}" --grid moe.top_k=2,9 --out sw

expect=("--seeds" "0")
run_case "sweep: --seeds 0" 2 no_setup "$moe" sweep --config "$moe_config" "${sweep_sets[@]}" "${grid[@]}" \
  --seeds 0 --out sw

expect=("train.global_batch" "--np 3")
run_case "sweep: a layout that does not fit --np" 2 no_setup "$moe" sweep --config "$moe_config" \
  "${sweep_sets[@]}" "${grid[@]}" --np 3 --out sw

expect=("--out" "afile" "not a directory")
run_case "sweep: --out is a file" 2 make_regular_file "$moe" sweep --config "$moe_config" "${sweep_sets[@]}" \
  "${grid[@]}" --out afile

expect=("--out" "another sweep" "grid")
run_case "sweep: --out holds another sweep" 2 other_sweep "$moe" sweep --config "$moe_config" \
  "${sweep_sets[@]}" "${grid[@]}" --out sw

expect=("--out" "no sweep_plan.json")
run_case "sweep: --out holds other files" 2 not_a_sweep "$moe" sweep --config "$moe_config" \
  "${sweep_sets[@]}" "${grid[@]}" --out sw

# As for --run-dir above: a read-only file system (root), or a directory without write permission (others).
if [ "$(id -u)" = 0 ] && unshare -m sh -c 'mount -t tmpfs -o ro,size=1m tmpfs /mnt' 2> /dev/null; then
  expect=("--out ro/sw" "read-only file system")
  run_case "sweep: --out on a read-only file system" 2 make_dir_ro unshare -m sh -c \
    'mount -t tmpfs -o ro,size=1m tmpfs ro && exec "$@"' sh "$moe" sweep --config "$moe_config" "${sweep_sets[@]}" \
    "${grid[@]}" --out ro/sw
elif [ "$(id -u)" != 0 ]; then
  expect=("--out locked/sw" "not writable")
  run_case "sweep: --out in a directory without write permission" 2 make_dir_locked "$moe" sweep \
    --config "$moe_config" "${sweep_sets[@]}" "${grid[@]}" --out locked/sw
fi

# ---- moe report. ------------------------------------------------------------------------------------------------
expect=("nowhere" "run directory")
run_case "report: a path that does not exist" 2 no_setup "$moe" report nowhere

expect=("sw" "neither metrics.jsonl")
run_case "report: a directory that is neither a run nor a sweep" 2 not_a_sweep "$moe" report sw

expect=("--out" "missing")
run_case "report: --out in a directory that does not exist" 2 previous_run "$moe" report run \
  --out missing/sub/r.html

# ---- Help. ------------------------------------------------------------------------------------------------------
for help in "--help" "train --help" "prep --help" "sweep --help" "report --help"; do
  case_name="moe $help"
  # shellcheck disable=SC2086  # $help is two words on purpose
  out=$("$moe" $help 2>&1)
  rc=$?
  if [ "$rc" = 0 ]; then pass; else fail "exit code $rc, expected 0"; fi
  needles=("--config" "--set")
  [ "$help" = "prep --help" ] && needles=("--input" "--out" "--tokenizer" "--vocab")
  [ "$help" = "sweep --help" ] && needles=("--config" "--grid" "--seeds" "--np" "--concurrent" "--out")
  [ "$help" = "report --help" ] && needles=("PATH" "--out")
  for needle in "${needles[@]}"; do
    if [[ "$out" == *"$needle"* ]]; then pass; else fail "help lacks '$needle'; it says: $out"; fi
  done
done

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
