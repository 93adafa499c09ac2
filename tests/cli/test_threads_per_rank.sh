#!/usr/bin/env bash
# Threads per rank with train.threads = 0: the cores this process may use shared by the node's ranks
# (launch/train/train_setup.cpp; docs/config.md, train.threads), through the real program on 2 cores
# (taskset -c 0,1): one rank alone takes both; 2 ranks under mpirun take one each; MOE_RANKS_PER_NODE (several hosts
# simulated on one machine) counts as the node's ranks; train.threads given stands. Read from metrics.jsonl's
# "threads" of step 1 (train.adapt_threads off, so nothing changes them during the step).
#
# Usage: test_threads_per_rank.sh MOE_BINARY SOURCE_DIR
set -u

if [ $# -ne 2 ]; then
  echo "usage: $0 MOE_BINARY SOURCE_DIR" >&2
  exit 2
fi
moe=$(realpath "$1")
config=$(realpath "$2/configs/tiny.json")
unset OMPI_COMM_WORLD_SIZE PMI_SIZE PMIX_SIZE OMPI_COMM_WORLD_LOCAL_SIZE MPI_LOCALNRANKS MOE_RANKS_PER_NODE
if [ "$(taskset -c 0,1 nproc 2> /dev/null)" != 2 ]; then
  echo "skipped: this machine cannot run a process on cores 0 and 1"
  exit 77
fi

small=(--set train.steps=1 --set model.d_model=32 --set model.layers=1 --set model.heads=2
       --set model.ffn_hidden=32 --set train.seq_len=16 --set train.global_batch=2 --set train.micro_batch=1
       --set train.eval_sequences=2 --set checkpoint.every=0 --set train.adapt_threads=false --quiet)
mpirun=(mpirun --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 --timeout 120)
[ "$(id -u)" = 0 ] && mpirun+=(--allow-run-as-root)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1

passed=0
failed=0
# expect_threads WANT NAME COMMAND...: the run in NAME/ exits 0 and its step 1 ran WANT threads.
expect_threads() {
  local want=$1 name=$2
  shift 2
  "$@" --run-dir "$name" > "$name.out" 2>&1
  local rc=$?
  local got
  got=$(python3 -c 'import json, sys
print(next(m["threads"] for m in map(json.loads, open(sys.argv[1])) if m.get("step") == 1 and "threads" in m))' \
    "$name/metrics.jsonl" 2> /dev/null)
  if [ $rc = 0 ] && [ "$got" = "$want" ]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAIL: $name: $want threads expected, got '$got' (exit $rc): $(tail -3 "$name.out")"
  fi
}

expect_threads 2 alone taskset -c 0,1 "$moe" train --config "$config" "${small[@]}" --set train.threads=0
expect_threads 1 two_ranks taskset -c 0,1 "${mpirun[@]}" -np 2 "$moe" train --config "$config" "${small[@]}" \
  --set train.threads=0
expect_threads 1 simulated_hosts env MOE_RANKS_PER_NODE=2 taskset -c 0,1 "$moe" train --config "$config" \
  "${small[@]}" --set train.threads=0
expect_threads 2 given taskset -c 0,1 "${mpirun[@]}" -np 2 "$moe" train --config "$config" "${small[@]}" \
  --set train.threads=2

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
