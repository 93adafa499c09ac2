#!/usr/bin/env bash
# The OpenBLAS kernels `moe train` runs (core/backend/cpu/blas_kernels.h, docs/design.md "BLAS kernels"): never
# OpenBLAS's generic Prescott set on a CPU with AVX2 (where the library does not know the CPU, the program runs
# again with OPENBLAS_CORETYPE set), the startup line and the manifest name the same set, and a variable the user
# set is kept as it is; ranks on different sets are warned of. Where the environment sets OPENBLAS_CORETYPE already (some machines do, for CPUs on which
# OpenBLAS's own choice is wrong), the test keeps it and checks that it is kept.
#
# Usage: test_blas_kernels.sh MOE_BINARY SOURCE_DIR
set -u
if [ $# -ne 2 ]; then
  echo "usage: $0 MOE_BINARY SOURCE_DIR" >&2
  exit 2
fi
moe=$1
config="$2/configs/tiny.json"
unset OMPI_COMM_WORLD_SIZE PMI_SIZE PMIX_SIZE OMPI_COMM_WORLD_LOCAL_SIZE MPI_LOCALNRANKS MOE_BLAS_FALLBACK
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
small=(--set train.steps=1 --set model.d_model=32 --set model.layers=1 --set model.heads=2
       --set model.ffn_hidden=32 --set train.seq_len=16 --set train.global_batch=2 --set train.micro_batch=1
       --set train.eval_sequences=2 --set train.threads=1 --resume none --overwrite)

passed=0
failed=0
check() {  # check NAME CONDITION-EXIT-CODE [DETAIL]
  if [ "$2" -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL [$1] ${3:-}"; fi
}

# The kernel set named by the startup line of a run in $work/$1 (its output in $work/$1.out).
run_train() {
  "$moe" train --config "$config" "${small[@]}" --run-dir "$work/$1" >"$work/$1.out" 2>&1
  echo $?
}

flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
avx2=0
[[ $flags == *" avx2 "* && $flags == *" fma "* ]] && avx2=1

rc=$(run_train plain)
check "plain run exits 0" "$rc" "exit $rc: $(cat "$work/plain.out")"
line=$(grep -o 'CPU GEMMs: OpenBLAS [A-Za-z0-9]* kernels.*' "$work/plain.out")
core=$(echo "$line" | awk '{print $4}')
[ -n "$core" ]
check "the startup line names the kernels" $? "$(cat "$work/plain.out")"
grep -q "\"openblas\": *\"[^\"]* $core " "$work/plain/manifest.json"
check "manifest.json names the same kernels" $? "$(grep openblas "$work/plain/manifest.json")"

avx512=$avx2  # AVX-512 as the program counts it (cpu_vectors.h): F, CD, BW, DQ and VL, with AVX2 and FMA
for f in avx512f avx512cd avx512bw avx512dq avx512vl; do [[ $flags == *" $f "* ]] || avx512=0; done

if [ -n "${OPENBLAS_CORETYPE:-}" ]; then
  # The environment's choice stands, and is said to be the variable's; a set narrower than the CPU's vectors is
  # said to leave them unused.
  kept="(OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE"
  [[ ($line == *"$kept)"* || $line == *"$kept; "*) && $line != *"does not know"* ]]
  check "the environment's OPENBLAS_CORETYPE is kept" $? "$line"
  if ((avx512)) && [[ $core == Haswell || $core == Zen ]]; then
    [[ $line == *"$kept; this CPU has AVX-512, which these kernels do not use);"* ]]
    check "an AVX2 set on an AVX-512 CPU is said to leave AVX-512 unused" $? "$line"
  fi
else
  if ((avx2)); then
    [ "$core" != Prescott ]
    check "no generic kernels on a CPU with AVX2" $? "$line"
  fi
  if [[ $line == *"does not know this CPU"* ]]; then
    [[ $line == *"OPENBLAS_CORETYPE=$core:"*"chose Prescott)"* ]]
    check "a replaced fallback is explained" $? "$line"
  fi
  # A user's choice stands, and is said to be theirs.
  if ((avx2)); then
    rc=$(OPENBLAS_CORETYPE=Haswell run_train chosen)
    check "run with OPENBLAS_CORETYPE exits 0" "$rc" "$(cat "$work/chosen.out")"
    note=""
    ((avx512)) && note="; this CPU has AVX-512, which these kernels do not use"
    grep -qF "CPU GEMMs: OpenBLAS Haswell kernels (OPENBLAS_CORETYPE=Haswell$note);" "$work/chosen.out"
    check "the user's OPENBLAS_CORETYPE is kept (and what it leaves unused said)" $? \
      "$(grep 'CPU GEMMs' "$work/chosen.out")"
  fi
fi

# Ranks on different kernel sets (hosts whose environments set OPENBLAS_CORETYPE differently): the run goes on and
# says so once, naming each set's first rank; a run whose ranks agree says nothing (the one-rank runs above).
grep -q "different OpenBLAS kernels" "$work/plain.out"
check "one rank: no warning of different kernels" $((1 - $?)) "$(cat "$work/plain.out")"
if command -v mpirun > /dev/null; then
  rank=("$moe" train --config "$config" "${small[@]}" --run-dir "$work/mixed")
  mpirun --allow-run-as-root --oversubscribe --bind-to none -np 1 -x OPENBLAS_CORETYPE=Prescott "${rank[@]}" : \
    -np 1 -x OPENBLAS_CORETYPE=Core2 "${rank[@]}" > "$work/mixed.out" 2>&1
  check "ranks on different kernels: exits 0" $? "$(cat "$work/mixed.out")"
  [ "$(grep -c "moe: warning: the ranks run different OpenBLAS kernels (Core2 from rank 1 on .*; Prescott from rank 0 on" \
    "$work/mixed.out")" = 1 ]
  check "ranks on different kernels: one warning naming each set's first rank" $? "$(cat "$work/mixed.out")"
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
