#!/usr/bin/env bash
# Faults of a host mid-run under `moe launch --hostfile` (tests/cluster/cluster.sh), 3 hosts of 2 slots, --np 4 (mh1
# and mh2 run the job, mh3 is the spare), each run finishing with the losses of an uninterrupted run, bit for bit:
# - every process of mh2 killed: a failure on mh2, but mh2 passes the probe, so it is kept (no spare used);
# - mh2 frozen: a hang on mh2, mh2 fails the probe ("frozen"), mh3 takes its place;
# - node-local checkpoints (checkpoint.node_local, on each host's own disk, with peer copies) and mh2 cut off: mh3
#   takes its place with an empty disk; what lived only on mh2's disk comes from the peer copies on mh1;
# - node-local checkpoints and mh2's disk wiped as all its processes are killed: mh2 is kept, and what lived only on
#   its disk comes from the peer copies on mh1;
# - a partition, {mh1} | {mh2, mh3}, every host still reaching this machine: the probe's connections between the
#   hosts find it, mh1 (reaching no other host) is left out and mh3 takes its place;
# - mpirun's daemon broken on mh2 (which passes the probe): the failed start is attributed to mh2 by starting a
#   process through mpirun on each host, and mh3 takes its place.
# Prints what each recovery took.
#
# Usage: test_host_faults.sh MOE_BINARY SOURCE_DIR (as root)
set -u
source "$(dirname "$0")/cluster.sh"
cluster_login "$0" "$@"
source "$(dirname "$0")/checks.sh"
training_test_args "$0" "$@"

cluster_up 3 2
export MOE_CLUSTER_CONNECT_TIMEOUT=2
shared="$CLUSTER_DIR/shared"
mkdir -p "$shared"
cd "$shared" || exit 1

timeout_s=5
small=(--set train.steps=60 --set model.d_model=32 --set model.layers=2 --set model.heads=2 --set model.ffn_hidden=64
       --set moe.expert_hidden=32 --set train.seq_len=32 --set train.global_batch=8 --set train.micro_batch=2
       --set train.log_every=1 --set train.eval_every=20 --set train.eval_sequences=4 --set train.threads=1
       --set parallel.ep=2 --set checkpoint.every=5 --set checkpoint.async=false
       --set fault.heartbeat_interval_s=0.2 --set fault.heartbeat_timeout_s=$timeout_s --set fault.probe_timeout_s=4
       --set fault.restart_backoff_s=0.5 --set fault.max_restarts=2)
mpi_small=(--mpirun-arg=--oversubscribe --mpirun-arg=--bind-to --mpirun-arg=none --mpirun-arg=--mca
           --mpirun-arg=mpi_yield_when_idle --mpirun-arg=1)

same_losses() {  # same_losses NAME: NAME's losses are the reference's; else what differs, and NAME's events
  [ "$(losses "$1")" = "$(losses reference)" ] && return 0
  diff <(losses reference) <(losses "$1") | head -8
  cut -c1-300 "$shared/$1/events.log"
  return 1
}

# faulted NAME FAULT [LAUNCH_ARGS...]: moe launch across the hosts; FAULT (a command) once 12 steps are logged;
# the exit code in $rc.
faulted() {
  local name=$1 fault=$2 i
  shift 2
  timeout 300 "$moe" launch --np 4 "${mpi_small[@]}" --hostfile "$CLUSTER_HOSTFILE" --config "$config" "${small[@]}" \
    "$@" --run-dir "$shared/$name" > "$name.out" 2> "$name.err" &
  local launcher=$!
  for i in $(seq 1 1200); do
    [ "$(logged "$name")" -ge 12 ] && break
    kill -0 $launcher 2> /dev/null || break
    sleep 0.05
  done
  $fault
  wait $launcher
  rc=$?
  echo "[ figures ] $name: $(events_of "$name" crash reason host detect_s)$(events_of "$name" hang reason host detect_s)" \
    "$(events_of "$name" probe attempt seconds | tail -n 1) $(events_of "$name" restart resume_step steps_lost)" \
    "$(events_of "$name" training attempt step time_to_train_s | tail -n 1)"
}

timeout 300 "$moe" launch --np 4 "${mpi_small[@]}" --config "$config" "${small[@]}" --run-dir "$shared/reference" \
  > reference.out 2> reference.err
check "reference: exit 0 ($(tail -2 reference.err))" test $? = 0

# ---- Every process of mh2 killed: mh2 is kept. ----------------------------------------------------------------
faulted killed "cluster_kill mh2"
check "killed: exit 0 ($(tail -3 killed.err))" test $rc = 0
check "killed: a failure on mh2" contains "$(events_of killed crash host)$(events_of killed hang host)" '"host": "mh2"'
check "killed: mh2 passed the probe, nothing lost" test "$(events_of killed host_lost host | wc -l)" = 0
check "killed: finished on mh1 and mh2 after 1 restart" \
  test "$(events_of killed finished restarts hosts_heard)" = '{"hosts_heard": ["mh1", "mh2"], "restarts": 1}'
check "killed: the losses of the uninterrupted run, bit for bit" same_losses killed

# ---- mh2 frozen: left out, mh3 takes its place. ---------------------------------------------------------------
faulted frozen "cluster_freeze mh2"
check "frozen: exit 0 ($(tail -3 frozen.err))" test $rc = 0
check "frozen: a silent hang on mh2" contains "$(events_of frozen hang reason host)" '"host": "mh2", "reason": "silent"'
check "frozen: mh2 lost as frozen" contains "$(events_of frozen host_lost host reason)" "the host is frozen"
check "frozen: mh3 took mh2's place" test "$(events_of frozen host_replaced host by)" = '{"by": "mh3", "host": "mh2"}'
check "frozen: finished on mh1 and mh3 after 1 restart" \
  test "$(events_of frozen finished restarts hosts_heard)" = '{"hosts_heard": ["mh1", "mh3"], "restarts": 1}'
check "frozen: the losses of the uninterrupted run, bit for bit" same_losses frozen
cluster_thaw mh2
cluster_kill mh2  # what was frozen: its connections are gone

# ---- Node-local checkpoints, mh2 cut off: mh3 starts with an empty disk, the peer copies on mh1 serve. ---------
node_local=(--set checkpoint.node_local=true --set checkpoint.peer_copy=true --set checkpoint.full_every=1
            --set "checkpoint.dir=$CLUSTER_LOCAL/ckpt")
faulted node_local "cluster_cut mh2" "${node_local[@]}"
check "node-local: exit 0 ($(tail -3 node_local.err))" test $rc = 0
check "node-local: mh3 took mh2's place" test "$(events_of node_local host_replaced host by)" = '{"by": "mh3", "host": "mh2"}'
check "node-local: the checkpoints were on the hosts' disks, not the shared one" \
  test -d "$CLUSTER_DIR/hosts/mh1/disk/ckpt" -a ! -e "$shared/node_local/checkpoints"
check "node-local: mh3's disk holds the checkpoints since it took over" \
  test "$(ls "$CLUSTER_DIR/hosts/mh3/disk/ckpt" | grep -c step-)" -gt 0
check "node-local: mh2's shards came from their peer copies on mh1" \
  grep -q "rank-00002.h5 is on no host; using the peer copy held by rank 0" node_local.err
check "node-local: the restart leaves the checkpoint to the ranks (none seen from here)" \
  contains "$(events_of node_local restart resume_step resume_note)" "the ranks choose"
check "node-local: resumed after step 0" python3 -c "import json, sys; sys.exit(not json.loads(sys.argv[1])['step'] > 5)" \
  "$(events_of node_local training attempt step | tail -n 1)"
check "node-local: the losses of the uninterrupted run, bit for bit" same_losses node_local
cluster_heal mh2
cluster_kill mh2  # the ranks it ran when cut off, left to spin by the supervisor as on a real cluster: a reboot

# ---- mh2's disk lost with every process of mh2: mh2 is kept, its shards come from their peer copies. -----------
# (frozen first: the wipe must not race mh2's own checkpoint rotation, nor the kill be skipped if it did)
disk_lost() {
  cluster_freeze mh2
  cluster_wipe_disk mh2
  cluster_kill mh2
  cluster_thaw mh2  # the host itself (its namespace holder) runs on
}
node_local[${#node_local[@]} - 1]="checkpoint.dir=$CLUSTER_LOCAL/ckpt_disk"
faulted disk_lost disk_lost "${node_local[@]}"
check "disk lost: exit 0 ($(tail -3 disk_lost.err))" test $rc = 0
check "disk lost: mh2 passed the probe and was kept" test "$(events_of disk_lost host_lost host | wc -l)" = 0
check "disk lost: finished on mh1 and mh2 after 1 restart" \
  test "$(events_of disk_lost finished restarts hosts_heard)" = '{"hosts_heard": ["mh1", "mh2"], "restarts": 1}'
check "disk lost: mh2's shards came from their peer copies on mh1" \
  grep -q "rank-00002.h5 is on no host; using the peer copy held by rank 0" disk_lost.err
check "disk lost: resumed after step 5" python3 -c "import json, sys; sys.exit(not json.loads(sys.argv[1])['step'] > 5)" \
  "$(events_of disk_lost training attempt step | tail -n 1)"
check "disk lost: mh2's disk holds checkpoints again" test "$(ls "$CLUSTER_DIR/hosts/mh2/disk/ckpt_disk" | grep -c step-)" -gt 0
check "disk lost: the losses of the uninterrupted run, bit for bit" same_losses disk_lost

# ---- A partition between the hosts: mh1 on one side, mh2 and mh3 on the other. ----------------------------------
# (checkpoint_timeout_s too: a checkpoint's collectives wait under that phase's timeout)
faulted partition "cluster_partition mh1 -- mh2 mh3" --set fault.step_timeout_s=5 --set fault.checkpoint_timeout_s=10
check "partition: exit 0 ($(tail -3 partition.err))" test $rc = 0
lost=$(events_of partition host_lost host reason)
check "partition: mh1 alone lost ($lost)" test "$(events_of partition host_lost host)" = '{"host": "mh1"}'
check "partition: as cut off from mh2 and mh3" contains "$lost" "cannot reach mh2, mh3 (a partition between the hosts"
check "partition: mh3 took mh1's place" test "$(events_of partition host_replaced host by)" = '{"by": "mh3", "host": "mh1"}'
check "partition: finished on mh2 and mh3 after 1 restart" \
  test "$(events_of partition finished restarts hosts_heard)" = '{"hosts_heard": ["mh2", "mh3"], "restarts": 1}'
check "partition: the losses of the uninterrupted run, bit for bit" same_losses partition
cluster_unpartition

# ---- mpirun cannot start its daemon on mh2 (mh2 passes the probe): the start fails before mh2's ranks report; the
# restart's probe starts a process through mpirun on each host, so mh2 is named, left out, and mh3 takes its place.
cluster_break_daemon mh2 || echo "FAIL: cannot break mh2's orted"
faulted daemon true
check "daemon: exit 0 ($(tail -3 daemon.err))" test $rc = 0
check "daemon: the first start failed with no rank heard from mh2" \
  contains "$(events_of daemon crash attempt hosts_unheard)" '"attempt": 0, "hosts_unheard": ["mh1", "mh2"]'
check "daemon: mh2 lost as mpirun could not start there ($(events_of daemon host_lost reason | cut -c1-240))" \
  contains "$(events_of daemon host_lost host reason)" '"host": "mh2", "reason": "mpirun cannot start its daemon'
check "daemon: mh3 took mh2's place" test "$(events_of daemon host_replaced host by)" = '{"by": "mh3", "host": "mh2"}'
check "daemon: finished on mh1 and mh3 after 1 restart" \
  test "$(events_of daemon finished restarts hosts_heard)" = '{"hosts_heard": ["mh1", "mh3"], "restarts": 1}'
check "daemon: the losses of the uninterrupted run, bit for bit" same_losses daemon
cluster_fix_daemon mh2

checks_summary
