#!/usr/bin/env bash
# The Slurm example for real (configs/slurm/train.sbatch): a Slurm cluster on the harness's hosts
# (tests/cluster/slurm.sh: slurmctld and munge on mh4, slurmd on mh1-mh3), the example submitted with sbatch from
# the login node for 3 nodes of 2 tasks. Inside the allocation `moe launch` takes its hosts from Slurm's variables
# (mh1 and mh2 train, mh3 is the spare) and mpirun starts its daemons through srun. Checked: the job trains to the
# end with the losses of the same layout on one host, bit for bit; then, with mh2's link cut mid-run, the spare
# takes its place and the run still ends with those losses.
#
# Usage: test_slurm.sh MOE_BINARY SOURCE_DIR (as root)
set -u
source "$(dirname "$0")/cluster.sh"
cluster_login "$0" "$@"
source "$(dirname "$0")/checks.sh"
source "$(dirname "$0")/slurm.sh"
training_test_args "$0" "$@"
source_dir=$(realpath "$2")

cluster_up 4 2
cluster_slurm_up mh4 mh1 mh2 mh3
export MOE_CLUSTER_CONNECT_TIMEOUT=2
shared="$CLUSTER_DIR/shared"
mkdir -p "$shared"
cd "$shared" || exit 1

small=(--set train.steps=40 --set model.d_model=32 --set model.layers=2 --set model.heads=2 --set model.ffn_hidden=64
       --set moe.expert_hidden=32 --set train.seq_len=32 --set train.global_batch=8 --set train.micro_batch=2
       --set train.log_every=1 --set train.eval_every=20 --set train.eval_sequences=4 --set train.threads=1
       --set parallel.ep=2 --set checkpoint.every=5 --set checkpoint.async=false
       --set fault.heartbeat_interval_s=0.2 --set fault.heartbeat_timeout_s=5 --set fault.probe_timeout_s=4
       --set fault.restart_backoff_s=0.5 --set fault.max_restarts=2)
mpi_small=(--mpirun-arg=--oversubscribe --mpirun-arg=--bind-to --mpirun-arg=none --mpirun-arg=--mca
           --mpirun-arg=mpi_yield_when_idle --mpirun-arg=1)

same_losses() { [ "$(losses "$1")" = "$(losses reference)" ] || { diff <(losses reference) <(losses "$1") | head -8; false; }; }

# submit NAME: the example through sbatch (3 nodes of 2 tasks), waiting for the job; its exit code in $rc.
submit() {
  local name=$1
  MOE_RUN_DIR="$shared/$name" MOE_BIN="$moe" MOE_CONFIG="$config" \
    sbatch --wait --nodes=3 --ntasks-per-node=2 --chdir="$source_dir" --output="$shared/$name.out" \
    --job-name="$name" "$source_dir/configs/slurm/train.sbatch" "${small[@]}" "${mpi_small[@]}" > "$name.sbatch" 2>&1
  rc=$?
}

timeout 300 "$moe" launch --np 4 "${mpi_small[@]}" --config "$config" "${small[@]}" --run-dir "$shared/reference" \
  > reference.out 2> reference.err
check "reference: exit 0 ($(tail -2 reference.err))" test $? = 0

# ---- The example trains across the allocation. -----------------------------------------------------------------
timeout 300 bash -c "$(declare -f submit); $(declare -p small mpi_small shared moe config source_dir); submit whole;
                     exit \$rc"
rc=$?
check "sbatch: the job exits 0 ($(tail -3 "$shared/whole.out"))" test $rc = 0
check "sbatch: the hosts came from Slurm" test -s "$shared/whole/hostfile.slurm"
check "sbatch: mh1 and mh2 train, mh3 is the spare" \
  test "$(cat "$shared/whole/hostfile.slurm")" = "$(printf 'mh1 slots=2\nmh2 slots=2\nmh3 slots=2')"
check "sbatch: finished on mh1 and mh2 without a restart" \
  test "$(events_of whole finished restarts hosts_heard)" = '{"hosts_heard": ["mh1", "mh2"], "restarts": 0}'
check "sbatch: the losses of one host, bit for bit" same_losses whole

# ---- mh2's link cut mid-run: the spare, mh3, takes its place inside the allocation. -----------------------------
timeout 300 bash -c "$(declare -f submit); $(declare -p small mpi_small shared moe config source_dir); submit cut;
                     exit \$rc" &
job=$!
for i in $(seq 1 1200); do
  [ "$(logged cut)" -ge 12 ] && break
  kill -0 $job 2> /dev/null || break
  sleep 0.05
done
cluster_cut mh2
wait $job
rc=$?
echo "[ figures ] cut: $(events_of cut hang reason host detect_s) $(events_of cut probe attempt seconds | tail -n 1)" \
  "$(events_of cut training attempt step time_to_train_s | tail -n 1)"
check "cut: the job exits 0 ($(tail -3 "$shared/cut.out"))" test $rc = 0
check "cut: a hang on mh2" contains "$(events_of cut hang host)" '"host": "mh2"'
check "cut: mh3 took mh2's place" test "$(events_of cut host_replaced host by)" = '{"by": "mh3", "host": "mh2"}'
check "cut: finished on mh1 and mh3 after 1 restart" \
  test "$(events_of cut finished restarts hosts_heard)" = '{"hosts_heard": ["mh1", "mh3"], "restarts": 1}'
check "cut: the losses of one host, bit for bit" same_losses cut
[ $failed = 0 ] || { tail -n 30 "$shared/whole.out" "$shared/cut.out"; cluster_slurm_logs; }

checks_summary
