#!/usr/bin/env bash
# `moe launch --hostfile` across simulated hosts (tests/cluster/cluster.sh): the heartbeat listener binds where the
# hosts reach this machine (fault.listen "auto": the route's source address, or an address given), the ranks on
# the hosts are heard, and the run finishes with exit 0 and no restart, with the losses of the same launch on one
# host. Refused before anything starts (exit 2, the key or file named, no run directory made): a loopback
# fault.listen with remote hosts, a host that does not resolve. Inside a Slurm allocation without --hostfile, the
# allocation's hosts (SLURM_JOB_NODELIST, SLURM_TASKS_PER_NODE) are used.
#
# Usage: test_launch_hosts.sh MOE_BINARY SOURCE_DIR (as root)
set -u
source "$(dirname "$0")/cluster.sh"
cluster_login "$0" "$@"
source "$(dirname "$0")/checks.sh"
training_test_args "$0" "$@"

cluster_up 2 2
shared="$CLUSTER_DIR/shared"
mkdir -p "$shared"
cd "$shared" || exit 1

small=(--set train.steps=6 --set model.d_model=32 --set model.layers=2 --set model.heads=2 --set model.ffn_hidden=64
       --set moe.expert_hidden=32 --set train.seq_len=32 --set train.global_batch=8 --set train.micro_batch=2
       --set train.log_every=1 --set train.eval_every=3 --set train.eval_sequences=4 --set train.threads=1
       --set parallel.ep=2 --set checkpoint.every=3 --set checkpoint.async=false
       --set fault.heartbeat_interval_s=0.2 --set fault.heartbeat_timeout_s=20 --set fault.max_restarts=0)
mpi_small=(--mpirun-arg=--oversubscribe --mpirun-arg=--bind-to --mpirun-arg=none --mpirun-arg=--mca
           --mpirun-arg=mpi_yield_when_idle --mpirun-arg=1)

# launch NAME ARGS...: moe launch --np 4 into $shared/NAME; exit code in $rc, stderr in NAME.err.
launch() {
  local name=$1
  shift
  timeout 300 "$moe" launch --np 4 "${mpi_small[@]}" "$@" --config "$config" "${small[@]}" --run-dir "$shared/$name" \
    > "$name.out" 2> "$name.err"
  rc=$?
}
events() { grep -c "\"event\":\"$2\"" "$shared/$1/events.log"; }
field() {  # field NAME EVENT KEY: KEY of the first EVENT of NAME's events.log
  python3 -c '
import json, sys
for line in open(sys.argv[1]):
    e = json.loads(line)
    if e["event"] == sys.argv[2]:
        print(e.get(sys.argv[3])); break
' "$shared/$1/events.log" "$2" "$3"
}

# ---- Across 2 hosts, fault.listen "auto": the bridge's address. ----------------------------------------------
launch hosts --hostfile "$CLUSTER_HOSTFILE"
check "2 hosts: exit 0 (got $rc; $(tail -3 hosts.err))" test "$rc" = 0
check "2 hosts: the listener is on the address the hosts reach" contains "$(field hosts start listen)" "$CLUSTER_LOGIN_ADDRESS:"
check "2 hosts: one start" test "$(events hosts start)" = 1
check "2 hosts: finished" test "$(events hosts finished)" = 1
check "2 hosts: no restart" test "$(field hosts finished restarts)" = 0
check "2 hosts: no crash, hang or restart logged" test "$(grep -cE '"event":"(crash|hang|restart)"' hosts/events.log)" = 0
check "2 hosts: heard the ranks of both hosts" test "$(field hosts finished hosts_heard)" = "['mh1', 'mh2']"

# The same launch on this machine alone: the same losses, bit for bit.
launch one_host --mpirun-arg=--mca --mpirun-arg=btl --mpirun-arg=self,vader
check "one host: exit 0 (got $rc; $(tail -3 one_host.err))" test "$rc" = 0
check "one host: the listener is on loopback" contains "$(field one_host start listen)" "127.0.0.1:"
check "one host: heard this machine only" test "$(field one_host finished hosts_heard)" = "['$(hostname)']"
check "2 hosts: the losses of one host, bit for bit" test "$(losses hosts)" = "$(losses one_host)"
check "2 hosts: 6 steps and 2 evaluations logged" test "$(losses hosts | wc -l)" = 8

# An explicit fault.listen the hosts reach.
launch explicit --hostfile "$CLUSTER_HOSTFILE" --set fault.listen="$CLUSTER_LOGIN_ADDRESS" --set train.steps=3
check "fault.listen given: exit 0 (got $rc; $(tail -3 explicit.err))" test "$rc" = 0
check "fault.listen given: bound there" contains "$(field explicit start listen)" "$CLUSTER_LOGIN_ADDRESS:"

# ---- Inside a Slurm allocation, without --hostfile: the allocation's hosts. (Only the node list and the tasks per
# node are set: without SLURM_JOB_ID OpenMPI itself does not look for srun, which this machine does not have.)
SLURM_JOB_NODELIST="mh[1-2]" SLURM_TASKS_PER_NODE="2(x2)" launch slurm --set train.steps=3
check "slurm: exit 0 (got $rc; $(tail -3 slurm.err))" test "$rc" = 0
check "slurm: the allocation's hosts as the hostfile" test "$(field slurm start hostfile)" = "$shared/slurm/hostfile.slurm"
check "slurm: mh1 and mh2, 2 slots each" test "$(cat slurm/hostfile.slurm | tr '\n' ' ')" = "mh1 slots=2 mh2 slots=2 "
check "slurm: heard the ranks of both hosts" test "$(field slurm finished hosts_heard)" = "['mh1', 'mh2']"
check "slurm: the listener on the address the hosts reach" contains "$(field slurm start listen)" "$CLUSTER_LOGIN_ADDRESS:"
SLURM_JOB_NODELIST="mh[1-2" launch slurm_bad --set train.steps=3
check "slurm: a malformed node list is refused (exit 2, got $rc)" test "$rc" = 2
check "slurm: naming the variable" grep -q "SLURM_JOB_NODELIST" slurm_bad.err
check "slurm: no run directory" test ! -e "$shared/slurm_bad"

# ---- Refused before anything starts. -------------------------------------------------------------------------
# refused NAME NEEDLE... : the last launch exited 2, named every needle, made no run directory.
refused() {
  local name=$1 needle
  shift
  check "$name: exit 2 (got $rc)" test "$rc" = 2
  for needle in "$@"; do check "$name: names '$needle' ($(cat "$name.err"))" grep -qF -- "$needle" "$name.err"; done
  check "$name: no run directory" test ! -e "$shared/$name"
}
for address in 127.0.0.1 127.0.0.2; do
  launch "loopback_$address" --hostfile "$CLUSTER_HOSTFILE" --set fault.listen=$address
  refused "loopback_$address" "fault.listen = \"$address\"" "loopback" "mh1"
done
printf 'mh1 slots=2\nnowhere-host slots=2\n' > bad_hosts.txt
launch unresolved --hostfile bad_hosts.txt
refused unresolved "--hostfile bad_hosts.txt" "nowhere-host" "does not resolve"
printf 'localhost slots=4\n' > local_hosts.txt
launch local_only --hostfile local_hosts.txt --set train.steps=2
check "a hostfile of this machine only: exit 0 (got $rc; $(tail -3 local_only.err))" test "$rc" = 0
check "a hostfile of this machine only: listens on loopback" contains "$(field local_only start listen)" "127.0.0.1:"

checks_summary
