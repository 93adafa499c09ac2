#!/usr/bin/env bash
# The cluster harness itself (tests/cluster/cluster.sh): hosts with their own hostname, address, /dev/shm and
# node-local disk; the rsh agent entering a host with a clean environment, and failing as ssh does when the
# host is cut off or frozen; every fault operation (cut and heal, partition, kill, freeze and thaw, disk wiped, rate
# limit); mpirun starting processes on the hosts through the agent; and cleanup leaving no namespace, link or
# process behind when a test ends normally, fails, or is killed with SIGKILL.
#
# Usage: test_harness.sh (as root)
set -u
source "$(dirname "$0")/cluster.sh"
cluster_login "$0" "$@"
source "$(dirname "$0")/checks.sh"

export OPENBLAS_MOE_HARNESS=machine  # a machine-wide setting (cluster_up records OPENBLAS_*), harmless to OpenBLAS
cluster_up 3 2
export MOE_CLUSTER_CONNECT_TIMEOUT=1

# ---- Each host is its own machine. ---------------------------------------------------------------------------
for h in 1 2 3; do
  check "mh$h has its hostname" test "$(cluster_exec mh$h hostname)" = "mh$h"
  check "mh$h has its address" contains "$(cluster_exec mh$h ip -4 -o addr show dev eth0)" "$CLUSTER_SUBNET.$h/24"
done
check "the login node keeps its own hostname" test "$(hostname)" != mh1
cluster_exec mh1 "echo shm > /dev/shm/moe-harness"
check "/dev/shm of mh1 holds its file" test "$(cluster_exec mh1 cat /dev/shm/moe-harness)" = shm
check "/dev/shm of mh2 does not" test "$(cluster_exec mh2 'ls /dev/shm')" = ""
check "/dev/shm of the login node does not" test ! -e /dev/shm/moe-harness
cluster_exec mh1 "echo one > $CLUSTER_LOCAL/on-mh1"
check "mh1's disk holds what mh1 wrote" test -f "$CLUSTER_DIR/hosts/mh1/disk/on-mh1"
check "mh2's disk does not" test ! -e "$CLUSTER_DIR/hosts/mh2/disk/on-mh1"
check "mh2 does not see it at the node-local path" test "$(cluster_exec mh2 "ls $CLUSTER_LOCAL")" = ""
check "the shared file system is shared" test "$(cluster_exec mh3 "cat $CLUSTER_DIR/hostfile" | wc -l)" = 3
check "mh2 resolves mh3" contains "$(cluster_exec mh2 'getent hosts mh3')" "$CLUSTER_SUBNET.3"

# ---- The agent is ssh: a clean environment, a shell command line, failures as exit 255. -------------------
env_on_host=$(MOE_HARNESS_SECRET=x cluster_exec mh1 env)
check "the agent passes no variable of the caller" lacks "$env_on_host" MOE_HARNESS_SECRET
check "nor OpenMPI's" lacks "$env_on_host" OMPI_MCA_btl
check "the machine's own settings reach the hosts, as on hosts of one image" contains "$env_on_host" \
  OPENBLAS_MOE_HARNESS=machine
check "the agent runs a shell command line" test "$(cluster_exec mh2 'echo a; echo b' | tr -d '\n')" = ab
check "an option before the host is skipped, as ssh's" test "$("$CLUSTER_SOURCE_DIR/rsh_agent.sh" -x mh3 hostname)" = mh3
"$CLUSTER_SOURCE_DIR/rsh_agent.sh" nohost true 2> err.txt
check "an unknown host: exit 255" test $? = 255
check "an unknown host is named" grep -q "Could not resolve hostname nohost" err.txt
rm -f err.txt

# tcp_ok [FROM [TO]]: a listener on TO (mh2; python3) and a connection to it from FROM (mh1).
tcp_ok() {
  local from=${1:-mh1} to=${2:-mh2}
  cluster_exec "$to" "timeout 8 python3 -c 'import socket; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, \
    socket.SO_REUSEADDR, 1); s.bind((\"0.0.0.0\", 5999)); s.listen(); s.settimeout(6); c, _ = s.accept(); \
    print(c.recv(16).decode().strip())'" > tcp.txt 2> /dev/null &
  local listener=$! sent=1
  sleep 1
  cluster_exec "$from" "timeout 3 bash -c 'echo hello > /dev/tcp/$CLUSTER_SUBNET.${to#mh}/5999'" 2> /dev/null && sent=0
  wait $listener
  [ $sent = 0 ] && [ "$(cat tcp.txt)" = hello ]
}
cd "$CLUSTER_DIR" || exit 1
check "mh1 reaches mh2 over TCP" tcp_ok

# ---- Cut and heal. -------------------------------------------------------------------------------------------
cluster_cut mh2
check "cut: mh1 no longer reaches mh2" test "$(
  cluster_exec mh1 "timeout 3 bash -c 'echo x > /dev/tcp/$CLUSTER_SUBNET.2/5999'" 2> /dev/null
  echo $?
)" != 0
cluster_exec mh2 true 2> err.txt
check "cut: the agent fails with 255" test $? = 255
check "cut: as a connect timeout" grep -q "Connection timed out (its link is down)" err.txt
cluster_heal mh2
check "healed: mh1 reaches mh2 again" tcp_ok

# ---- Partition: {mh1} | {mh2, mh3}; the login node reaches every host. -----------------------------------------
cluster_partition mh1 -- mh2 mh3
tcp_fails() { ! tcp_ok "$@"; }
check "partition: mh1 no longer reaches mh2" tcp_fails mh1 mh2
check "partition: nor mh2 mh1" tcp_fails mh2 mh1
check "partition: mh3 still reaches mh2" tcp_ok mh3 mh2
check "partition: the login node still reaches mh1" test "$(cluster_exec mh1 hostname)" = mh1
cluster_rate mh1 2mbit
cluster_unpartition
check "partition healed: mh1 reaches mh2 again" tcp_ok mh1 mh2
check "partition healed: the rate limit stays" contains "$(tc qdisc show dev "$(cat "$CLUSTER_DIR/hosts/mh1/veth")")" "tbf"
cluster_rate mh1 off

# ---- Rate limit. ---------------------------------------------------------------------------------------------
cluster_rate mh3 2mbit
veth3=$(cat "$CLUSTER_DIR/hosts/mh3/veth")
check "rate: the bridge side is limited" contains "$(tc qdisc show dev "$veth3")" "tbf"
check "rate: at 2 Mbit/s" contains "$(tc qdisc show dev "$veth3")" "rate 2Mbit"
check "rate: the host side is limited" contains "$(cluster_exec mh3 tc qdisc show dev eth0)" "rate 2Mbit"
cluster_rate mh3 off
check "rate off: no tbf left" lacks "$(tc qdisc show dev "$veth3") $(cluster_exec mh3 tc qdisc show dev eth0)" tbf

# ---- Kill, freeze and thaw, wipe. ----------------------------------------------------------------------------
cluster_exec mh1 "sleep 600" &
cluster_exec mh1 "sleep 601" &
sleep 1
host_procs() { ps -o args= -p "$(cluster_host_pids "$1" | paste -sd,)" 2> /dev/null; }
check "kill: mh1 runs two sleeps" test "$(host_procs mh1 | grep -c '^sleep 60[01]')" = 2
cluster_kill mh1
wait
sleep 0.2
check "kill: no sleep left on mh1" test "$(host_procs mh1 | grep -c '^sleep 60[01]')" = 0
check "kill: mh1 itself is up" test "$(cluster_exec mh1 hostname)" = mh1

cluster_exec mh2 "sleep 602" &
for i in $(seq 1 100); do
  sleep_pid=$(for p in $(cluster_host_pids mh2); do ps -o pid=,args= -p "$p"; done | awk '$2 == "sleep" && $3 == 602 {print $1}')
  [ -n "$sleep_pid" ] && break
  sleep 0.1
done
state() { awk '/^State:/ {print $2}' "/proc/$1/status"; }
stopped() {  # a signal is delivered asynchronously: the state follows within moments
  for i in $(seq 1 50); do
    [ "$(state "$1")" = T ] && return 0
    sleep 0.1
  done
  return 1
}
cluster_freeze mh2
check "freeze: the process is stopped ($sleep_pid)" stopped "$sleep_pid"
cluster_exec mh2 true 2> err.txt
check "freeze: the agent fails with 255" test $? = 255
check "freeze: as a frozen host" grep -q "the host is frozen" err.txt
cluster_thaw mh2
running() {
  for i in $(seq 1 50); do
    [ "$(state "$1")" != T ] && return 0
    sleep 0.1
  done
  return 1
}
check "thaw: the process runs again" running "$sleep_pid"
check "thaw: the agent reaches mh2" test "$(cluster_exec mh2 hostname)" = mh2
cluster_kill mh2
wait

cluster_wipe_disk mh1
check "wipe: mh1's disk is empty" test "$(cluster_exec mh1 "ls -A $CLUSTER_LOCAL")" = ""
cluster_exec mh1 "echo again > $CLUSTER_LOCAL/again"
check "wipe: mh1 writes to its disk again" test -f "$CLUSTER_DIR/hosts/mh1/disk/again"

# ---- mpirun starts its daemons through the agent. ------------------------------------------------------------
ranks=$(mpirun --allow-run-as-root -np 6 --hostfile "$CLUSTER_HOSTFILE" sh -c 'echo $(hostname)' 2> mpirun.err | sort | uniq -c |
  awk '{print $2 "x" $1}' | paste -sd' ')
check "mpirun puts 2 ranks on each host ($ranks; $(cat mpirun.err))" test "$ranks" = "mh1x2 mh2x2 mh3x2"

# ---- Cleanup: a test that fails, and one killed with SIGKILL, leave nothing behind. -------------------------
child="$CLUSTER_DIR/child.sh"
cat > "$child" << EOF
source "$CLUSTER_SOURCE_DIR/cluster.sh"
cluster_login "\$0" "\$@"
cluster_up 2
echo "\$CLUSTER_ID \$(cat \$CLUSTER_DIR/hosts/mh1/holder) \$(cat \$CLUSTER_DIR/hosts/mh2/holder)" > "\$1"
"$CLUSTER_SOURCE_DIR/rsh_agent.sh" mh1 "sleep 600" &
if [ "\$2" = fail ]; then sleep 1; exit 7; fi
sleep 600
EOF
left_behind() {  # left_behind ID HOLDER...: anything of cluster ID still there
  local id=$1 p
  shift
  ip netns list 2> /dev/null | grep -q "moe-$id-" && return 0
  ip link show "mcb$id" > /dev/null 2>&1 && return 0
  for p in "$@"; do kill -0 "$p" 2> /dev/null && return 0; done
  return 1
}
nothing_left() { ! left_behind "$@"; }
env -u MOE_CLUSTER_LOGIN -u MOE_CLUSTER_DIR bash "$child" "$CLUSTER_DIR/child-fail.txt" fail > /dev/null 2>&1
check "a failing test keeps its exit code" test $? = 7
read -r -a made < "$CLUSTER_DIR/child-fail.txt"
check "a failing test leaves nothing behind" nothing_left "${made[@]}"

env -u MOE_CLUSTER_LOGIN -u MOE_CLUSTER_DIR bash "$child" "$CLUSTER_DIR/child-kill.txt" kill > /dev/null 2>&1 &
killed=$!
for i in $(seq 1 100); do [ -s "$CLUSTER_DIR/child-kill.txt" ] && break || sleep 0.1; done
sleep 1
read -r -a made < "$CLUSTER_DIR/child-kill.txt"
check "the killed test's cluster exists before the kill" left_behind "${made[@]}"
kill -KILL "$killed"
wait "$killed" 2> /dev/null
for i in $(seq 1 100); do left_behind "${made[@]}" && sleep 0.1 || break; done
check "a test killed with SIGKILL leaves nothing behind (the reaper)" nothing_left "${made[@]}"

# ---- Without the rights to make namespaces, a test fails saying why. ----------------------------------------------
# (the cluster's directory is root's alone: the unprivileged test is given on the command line)
env -u MOE_CLUSTER_LOGIN -u MOE_CLUSTER_DIR setpriv --reuid 65534 --regid 65534 --clear-groups \
  bash -c 'cd /; source "$1/cluster.sh"; cluster_login "$0"; cluster_up 2' "$0" "$CLUSTER_SOURCE_DIR" > /dev/null 2> err.txt
rc=$?
check "not root: exit 1 (got $rc)" test $rc = 1
check "not root: says so ($(cat err.txt))" grep -q "need root" err.txt
env -u MOE_CLUSTER_LOGIN -u MOE_CLUSTER_DIR setpriv --bounding-set -sys_admin,-net_admin \
  bash "$child" /dev/null fail > /dev/null 2> err.txt
rc=$?
check "root without CAP_SYS_ADMIN: exit 1 (got $rc)" test $rc = 1
check "root without CAP_SYS_ADMIN: says why ($(cat err.txt))" grep -q "cannot create a mount namespace.*CAP_SYS_ADMIN" err.txt

checks_summary
