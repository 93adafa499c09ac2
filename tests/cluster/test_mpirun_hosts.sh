#!/usr/bin/env bash
# `mpirun --hostfile` across simulated hosts (tests/cluster/cluster.sh), over TCP between them: configs/tiny_moe.json
# (made small) trained at dp 4 x ep 2 on 2 hosts of 2 ranks gives the losses, gradient norms and final
# parameters of the same layout on one host, bit for bit; and again with the ranks spread round-robin over the
# hosts (--map-by node), so that every expert-parallel all-to-all crosses hosts. On 4 hosts of 2 ranks: tp 2 within
# a host with ep 2 and dp 4 across hosts, and tp 2 x pp 2 (the pipeline's stages on different hosts) x dp 2 x ep 2,
# each equal to the same layout on one host, bit for bit.
#
# Usage: test_mpirun_hosts.sh MOE_BINARY SOURCE_DIR (as root)
set -u
source "$(dirname "$0")/cluster.sh"
cluster_login "$0" "$@"
source "$(dirname "$0")/checks.sh"
training_test_args "$0" "$@"

cluster_up 4 2
shared="$CLUSTER_DIR/shared"
mkdir -p "$shared"
cd "$shared" || exit 1
head -n 2 "$CLUSTER_HOSTFILE" > two_hosts.txt

small=(--set train.steps=6 --set model.d_model=32 --set model.layers=2 --set model.heads=2 --set model.ffn_hidden=64
       --set moe.expert_hidden=32 --set train.seq_len=32 --set train.global_batch=8 --set train.micro_batch=2
       --set train.log_every=1 --set train.eval_every=3 --set train.eval_sequences=4 --set train.threads=1
       --set parallel.ep=2 --set checkpoint.every=6 --set checkpoint.async=false --quiet)
mpi_small=(--allow-run-as-root --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 --timeout 240)

# train NAME MPIRUN_ARGS... [-- TRAIN_ARGS...]: 4 ranks (unless MPIRUN_ARGS says -np); the run directory is
# $shared/NAME; 0 when mpirun succeeded.
train() {
  local name=$1 mpi=() extra=()
  shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do mpi+=("$1") && shift; done
  [ $# -gt 0 ] && shift && extra=("$@")
  mpirun -np "${np:-4}" "${mpi_small[@]}" "${mpi[@]}" "$moe" train --config "$config" "${small[@]}" "${extra[@]}" \
    --run-dir "$shared/$name" > "$name.out" 2>&1 || { cat "$name.out"; return 1; }
}
# The numbers of metrics.jsonl that depend on the arithmetic alone, one line per logged step.
numbers() {
  python3 -c '
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    print(m["step"], *(repr(m[k]) for k in ("loss", "lm_loss", "aux_loss", "z_loss", "grad_norm", "eval_loss") if k in m))
' "$shared/$1/metrics.jsonl"
}
export_final() {  # export_final NAME: the final checkpoint's full tensors in NAME.h5
  "$moe" ckpt export "$shared/$1/checkpoints/step-00000006" --out "$shared/$1.h5" > /dev/null
}

check "one host: trains" train one_host --mca btl self,vader
check "two hosts by slot: trains" train by_slot --hostfile two_hosts.txt -x OMP_NUM_THREADS=1
check "two hosts round-robin: trains" train by_node --hostfile two_hosts.txt --map-by node -x OMP_NUM_THREADS=1

numbers one_host > one_host.txt
check "one host: 6 steps and 2 evaluations logged" test "$(wc -l < one_host.txt)" = 8
for run in by_slot by_node; do
  numbers $run > $run.txt
  check "$run: the losses and gradient norms of one host, bit for bit" cmp one_host.txt $run.txt
done
host_of_rank0() { python3 -c 'import json, sys; print(*json.load(open(sys.argv[1]))["hosts"])' "$shared/$1/manifest.json"; }
check "one host: rank 0 ran on the login node" test "$(host_of_rank0 one_host)" = "$(hostname)"
for run in by_slot by_node; do check "$run: rank 0 ran on mh1" test "$(host_of_rank0 $run)" = mh1; done

export_final one_host && export_final by_slot && export_final by_node
for run in by_slot by_node; do
  check "$run: the final parameters of one host, bit for bit" h5diff -q --exclude-attribute / one_host.h5 $run.h5
done

# ---- 4 hosts x 2 ranks: tp within a host; ep, dp and pp across hosts. -----------------------------------------
np=8
tp_ep=(-- --set parallel.tp=2 --set parallel.ep=2)
tp_pp=(-- --set parallel.tp=2 --set parallel.pp=2 --set parallel.ep=2)
check "one host, tp 2 x ep 2 x dp 4: trains" train one_tp --mca btl self,vader "${tp_ep[@]}"
check "4 hosts, tp 2 x ep 2 x dp 4: trains" train hosts_tp --hostfile "$CLUSTER_HOSTFILE" "${tp_ep[@]}"
check "one host, tp 2 x pp 2 x dp 2 x ep 2: trains" train one_pp --mca btl self,vader "${tp_pp[@]}"
check "4 hosts, tp 2 x pp 2 x dp 2 x ep 2: trains" train hosts_pp --hostfile "$CLUSTER_HOSTFILE" "${tp_pp[@]}"
for pair in "one_tp hosts_tp" "one_pp hosts_pp"; do
  read -r one hosts <<< "$pair"
  numbers $one > $one.txt
  numbers $hosts > $hosts.txt
  check "$hosts: 6 steps and 2 evaluations logged" test "$(wc -l < $hosts.txt)" = 8
  check "$hosts: the losses of one host, bit for bit" cmp $one.txt $hosts.txt
  export_final $one && export_final $hosts
  check "$hosts: the final parameters of one host, bit for bit" h5diff -q --exclude-attribute / $one.h5 $hosts.h5
done
differ() { ! cmp -s "$1" "$2"; }
check "tp 2 x ep 2 differs from dp 4 x ep 2 in the last bits (the comparison can fail)" differ one_host.txt one_tp.txt

checks_summary
