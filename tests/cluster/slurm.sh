# A Slurm cluster on the harness's hosts (source after cluster.sh, once cluster_up has run; bash): Debian's
# slurm-wlm 22.05 and munge. The controller (slurmctld) and munge's daemon run on one host, a slurmd on each of the
# others; the login node (the test) submits with sbatch, as a user does. Every daemon is a process of a host, so
# cluster_down ends them with the hosts. munge's socket is a path, which every network namespace reaches; its key
# and the daemons' state, spool and logs live in $CLUSTER_DIR/slurm.
#
#   cluster_slurm_up CONTROLLER NODE...   starts munged and slurmctld on CONTROLLER, slurmd on each NODE (partition
#                                         "hosts", every NODE), and waits until sinfo shows the nodes idle
#   cluster_slurm_logs                    the daemons' last log lines (for a failed check)
#
# The configuration is the smallest that runs jobs without cgroups or accounting: proctrack/linuxproc, task/none,
# select/linear (whole nodes), root as SlurmUser (the harness runs as root).

cluster_slurm_fail() {
  cluster_slurm_logs >&2
  cluster_fail "$@"
}

cluster_slurm_logs() {
  local f
  for f in "$CLUSTER_DIR"/slurm/log/*.log; do
    echo "== $f"
    tail -n 8 "$f"
  done
}

# cluster_slurm_conf CONTROLLER NODE...: slurm.conf and cgroup.conf in $CLUSTER_DIR/slurm.
cluster_slurm_conf() {
  local controller=$1 d="$CLUSTER_DIR/slurm" node
  shift
  {
    echo "ClusterName=moetest"
    echo "SlurmctldHost=$controller($(cluster_host_var "$controller" address))"
    echo "SlurmUser=root"
    echo "AuthType=auth/munge"
    echo "AuthInfo=socket=$d/munge/munge.socket"
    echo "CredType=cred/munge"
    echo "StateSaveLocation=$d/state"
    echo "SlurmdSpoolDir=$d/spool/%n"
    echo "SlurmctldPidFile=$d/slurmctld.pid"
    echo "SlurmdPidFile=$d/spool/slurmd-%n.pid"
    echo "SlurmctldLogFile=$d/log/slurmctld.log"
    echo "SlurmdLogFile=$d/log/slurmd-%n.log"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "SelectType=select/linear"
    echo "SchedulerType=sched/builtin"
    echo "ReturnToService=2"
    echo "MpiDefault=none"
    for node in "$@"; do
      echo "NodeName=$node NodeAddr=$(cluster_host_var "$node" address) CPUs=$(nproc) State=UNKNOWN"
    done
    echo "PartitionName=hosts Nodes=$(echo "$@" | tr ' ' ,) Default=YES MaxTime=INFINITE State=UP"
  } > "$d/slurm.conf"
  # The hosts' /sys has no cgroup mounts; naming the plugin keeps slurmd from looking for them.
  echo "CgroupPlugin=cgroup/v1" > "$d/cgroup.conf"
}

cluster_slurm_up() {
  local controller=$1 d="$CLUSTER_DIR/slurm" node i
  shift
  command -v slurmctld > /dev/null && command -v slurmd > /dev/null && command -v munged > /dev/null ||
    cluster_fail "slurmctld, slurmd or munged is not installed (Debian: slurm-wlm, munge)"
  mkdir -p "$d/state" "$d/log" "$d/munge"
  chmod 0755 "$d/munge"
  head -c 1024 /dev/urandom > "$d/munge.key"
  chmod 0400 "$d/munge.key"
  cluster_slurm_conf "$controller" "$@"
  export SLURM_CONF="$d/slurm.conf"
  cluster_exec "$controller" "munged --force --key-file=$d/munge.key --socket=$d/munge/munge.socket" \
    "--pid-file=$d/munge/munged.pid --seed-file=$d/munge/seed --log-file=$d/log/munged.log" ||
    cluster_slurm_fail "munged did not start on $controller"
  cluster_exec "$controller" "slurmctld -f $SLURM_CONF" || cluster_slurm_fail "slurmctld did not start on $controller"
  for node in "$@"; do
    mkdir -p "$d/spool/$node"
    cluster_exec "$node" "slurmd -f $SLURM_CONF -N $node" || cluster_slurm_fail "slurmd did not start on $node"
  done
  for i in $(seq 1 100); do
    [ "$(sinfo -h -o '%t %D' 2> /dev/null)" = "idle $#" ] && return 0
    sleep 0.2
  done
  cluster_slurm_fail "the Slurm nodes $* are not idle after 20 s: $(sinfo 2>&1)"
}
