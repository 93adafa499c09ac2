# A cluster of simulated hosts on one machine, for tests (source this file; bash). Each host is a network
# namespace with its own address on a bridge, its own hostname (UTS namespace), its own /dev/shm and its own
# node-local disk (a mount namespace: the host's disk directory is mounted at one path, $CLUSTER_LOCAL, the
# same on every host, as a node-local SSD would be). OpenMPI reaches the hosts the way it reaches real ones,
# through its rsh agent (tests/cluster/rsh_agent.sh, in the environment as OMPI_MCA_plm_rsh_agent), which
# enters a host's namespaces with a login's clean environment, as ssh would. What stays shared, as on a
# cluster with a network file system: the file system outside $CLUSTER_LOCAL (the build, the run directories).
#
# The test itself runs as the "login node": in the root network namespace (the bridge's address) and in a
# mount namespace of its own, where /etc/hosts names the hosts (cluster_login re-executes the test there).
#
#   cluster_login "$0" "$@"     first thing in a test: re-executes it in its own mount namespace
#   cluster_up N [SLOTS]        N hosts mh1..mhN; $CLUSTER_HOSTFILE lists them with SLOTS slots each (1)
#   cluster_cut HOST / cluster_heal HOST     the host's link down / up (its processes go on, unreachable)
#   cluster_kill HOST           SIGKILL to every process of the host (the host itself stays up)
#   cluster_freeze HOST / cluster_thaw HOST  SIGSTOP / SIGCONT to every process of the host
#   cluster_wipe_disk HOST      deletes everything on the host's node-local disk
#   cluster_break_daemon HOST / cluster_fix_daemon HOST  OpenMPI's daemon (orted) on the host exits 1 at once
#                               (/bin/false bound over it in the host's mount namespace) / works again
#   cluster_rate HOST RATE      limits the host's link both ways to RATE (tc tbf, e.g. 20mbit); "off" removes it
#   cluster_partition A... -- B...   hosts A and hosts B no longer reach each other (each still reaches the
#                               login node and its own group); cluster_unpartition removes every partition
#   cluster_exec HOST CMD...    runs CMD on the host (through the agent, as mpirun's daemons are)
#   cluster_down                ends every process of the hosts, deletes namespaces, links and directories
#
# Cleanup always happens: cluster_up installs an EXIT trap calling cluster_down, and starts a reaper that
# tears the cluster down when the test's process is gone, however it ended (SIGKILL by ctest's timeout too).
# Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) and iproute2, util-linux; a test that cannot create namespaces
# fails saying why.

CLUSTER_SOURCE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# cluster_login SCRIPT ARGS...: re-executes the test in a private mount namespace (once).
cluster_login() {
  if [ -n "${MOE_CLUSTER_LOGIN:-}" ]; then return 0; fi
  if [ "$(id -u)" != 0 ]; then
    echo "cluster: the cluster tests make network namespaces and need root (they run as $(id -un))" >&2
    exit 1
  fi
  local err
  if ! err=$(unshare --mount --propagation private true 2>&1); then
    echo "cluster: cannot create a mount namespace (unshare: $err); the cluster tests need root with CAP_SYS_ADMIN" \
      "and CAP_NET_ADMIN, as CI has" >&2
    exit 1
  fi
  export MOE_CLUSTER_LOGIN=1
  exec unshare --mount --propagation private bash "$@"
}

cluster_fail() {
  echo "cluster: $*" >&2
  exit 1
}

# Picks 10.213.X.0/24 with X unused by any address of this machine.
cluster_pick_subnet() {
  local x try
  for try in $(seq 1 50); do
    x=$(((RANDOM % 250) + 1))
    if ! ip -4 addr show | grep -q "inet 10\.213\.$x\."; then
      echo "10.213.$x"
      return 0
    fi
  done
  cluster_fail "no free subnet 10.213.X.0/24 found"
}

# The reaper: waits for the test's process to end, then tears the cluster down from its state files.
cluster_start_reaper() {
  local owner=$1
  setsid bash -c 'while kill -0 '"$owner"' 2>/dev/null; do sleep 0.5; done
                  source "'"$CLUSTER_SOURCE_DIR"'/cluster.sh"; CLUSTER_DIR="'"$CLUSTER_DIR"'" cluster_teardown' \
    < /dev/null > /dev/null 2>&1 &
  echo $! > "$CLUSTER_DIR/reaper.pid"
  disown
}

cluster_host_var() { cat "$CLUSTER_DIR/hosts/$1/$2" 2>/dev/null; }

# cluster_add_host I SLOTS: namespace, veth on the bridge, address, and the host's holder process (its
# hostname, /dev/shm and disk live in the holder's namespaces; the agent enters them).
cluster_add_host() {
  local i=$1 name="mh$1" ns="moe-$CLUSTER_ID-mh$1" veth="mcv$CLUSTER_ID$1" dir="$CLUSTER_DIR/hosts/mh$1"
  mkdir -p "$dir/disk"
  echo "$ns" > "$dir/netns"
  echo "$veth" > "$dir/veth"
  echo "$CLUSTER_SUBNET.$i" > "$dir/address"
  ip netns add "$ns" || cluster_fail "ip netns add $ns failed"
  ip link add "$veth" type veth peer name eth0 netns "$ns" || cluster_fail "ip link add $veth failed"
  ip link set "$veth" master "$CLUSTER_BRIDGE" up
  ip -n "$ns" addr add "$CLUSTER_SUBNET.$i/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  # No --fork: unshare executes sh, so sh's $$ is the holder's pid. setsid: a signal to the test's process
  # group does not end a host before cluster_down has run.
  setsid ip netns exec "$ns" unshare --uts --mount --propagation private \
    sh -c 'hostname "$1" && mount -t tmpfs -o size=512m tmpfs /dev/shm && mount --bind "$2/disk" "$3" &&
           echo $$ > "$2/holder.tmp" && mv "$2/holder.tmp" "$2/holder" && exec sleep infinity' \
    sh "$name" "$dir" "$CLUSTER_LOCAL" < /dev/null > "$dir/holder.log" 2>&1 &
  disown
  local waited
  for waited in $(seq 1 100); do
    [ -s "$dir/holder" ] && break
    sleep 0.1
  done
  [ -s "$dir/holder" ] || cluster_fail "host $name did not start: $(cat "$dir/holder.log")"
  echo "$CLUSTER_SUBNET.$i $name" >> "$CLUSTER_DIR/etc_hosts"
  echo "$name slots=$2" >> "$CLUSTER_HOSTFILE"
}

cluster_up() {
  local n=$1 slots=${2:-1} i
  [ -n "${MOE_CLUSTER_LOGIN:-}" ] || cluster_fail "call cluster_login \"\$0\" \"\$@\" first"
  command -v ip > /dev/null || cluster_fail "ip (Debian: iproute2) is not installed"
  command -v nsenter > /dev/null || cluster_fail "nsenter (Debian: util-linux) is not installed"
  CLUSTER_ID=$(printf '%04x' $((($$ + RANDOM) % 65536)))
  CLUSTER_DIR=$(mktemp -d "${TMPDIR:-/tmp}/moe-cluster.XXXXXX")
  # Before anything is made: can this process make namespaces at all?
  local probe="moe-$CLUSTER_ID-probe" err
  if ! err=$(ip netns add "$probe" 2>&1); then
    rm -rf "$CLUSTER_DIR"
    cluster_fail "cannot create a network namespace (ip netns add: $err); the cluster tests need root with" \
      "CAP_SYS_ADMIN and CAP_NET_ADMIN, as CI has"
  fi
  ip netns del "$probe"
  CLUSTER_SUBNET=$(cluster_pick_subnet)
  CLUSTER_BRIDGE="mcb$CLUSTER_ID"
  CLUSTER_LOCAL="$CLUSTER_DIR/local"
  CLUSTER_HOSTFILE="$CLUSTER_DIR/hostfile"
  CLUSTER_LOGIN_ADDRESS="$CLUSTER_SUBNET.254"
  mkdir -p "$CLUSTER_DIR/hosts" "$CLUSTER_LOCAL"
  echo "$CLUSTER_BRIDGE" > "$CLUSTER_DIR/bridge"
  : > "$CLUSTER_HOSTFILE"
  printf '127.0.0.1 localhost\n%s %s\n' "$CLUSTER_LOGIN_ADDRESS" "$(hostname)" > "$CLUSTER_DIR/etc_hosts"
  trap cluster_on_exit EXIT
  cluster_start_reaper $$
  ip link add "$CLUSTER_BRIDGE" type bridge || cluster_fail "ip link add $CLUSTER_BRIDGE type bridge failed"
  ip addr add "$CLUSTER_LOGIN_ADDRESS/24" dev "$CLUSTER_BRIDGE"
  ip link set "$CLUSTER_BRIDGE" up
  # The hosts file of the login node, which the hosts inherit (their mount namespaces are copies of it).
  touch "$CLUSTER_DIR/etc_hosts"
  mount --bind "$CLUSTER_DIR/etc_hosts" /etc/hosts || cluster_fail "cannot mount the cluster's /etc/hosts"
  for i in $(seq 1 "$n"); do cluster_add_host "$i" "$slots"; done
  export CLUSTER_DIR CLUSTER_ID CLUSTER_SUBNET CLUSTER_BRIDGE CLUSTER_LOCAL CLUSTER_HOSTFILE CLUSTER_LOGIN_ADDRESS
  export MOE_CLUSTER_DIR="$CLUSTER_DIR"
  # What the machine gives every process (OPENBLAS_*: which BLAS kernels run), which a login on a host made from the
  # same machine image has too: the agent gives the hosts the login node's (tests/cluster/rsh_agent.sh).
  env | grep -E '^OPENBLAS_[A-Za-z0-9_]*=' > "$CLUSTER_DIR/machine_env" || true
  export OMPI_MCA_plm_rsh_agent="$CLUSTER_SOURCE_DIR/rsh_agent.sh"
  export OMPI_MCA_btl=tcp,self
  export OMPI_MCA_btl_tcp_if_include="$CLUSTER_SUBNET.0/24"
  export OMPI_MCA_oob_tcp_if_include="$CLUSTER_SUBNET.0/24"
}

# Every process whose network namespace is the host's (the holder too).
cluster_host_pids() { ip netns pids "$(cluster_host_var "$1" netns)" 2> /dev/null; }
cluster_holder() { cluster_host_var "$1" holder; }

cluster_break_daemon() { nsenter --target "$(cluster_holder "$1")" --mount mount --bind /bin/false "$(command -v orted)"; }
cluster_fix_daemon() { nsenter --target "$(cluster_holder "$1")" --mount umount "$(command -v orted)"; }

cluster_cut() { ip link set "$(cluster_host_var "$1" veth)" down; }
cluster_heal() { ip link set "$(cluster_host_var "$1" veth)" up; }

cluster_kill() {
  local holder pid
  holder=$(cluster_holder "$1")
  for pid in $(cluster_host_pids "$1"); do
    [ "$pid" = "$holder" ] || kill -KILL "$pid" 2> /dev/null
  done
}

cluster_freeze() {
  local pid
  for pid in $(cluster_host_pids "$1"); do kill -STOP "$pid" 2> /dev/null; done
}
cluster_thaw() {
  local pid
  for pid in $(cluster_host_pids "$1"); do kill -CONT "$pid" 2> /dev/null; done
}

cluster_wipe_disk() {  # what the host deletes meanwhile is gone either way; the disk ends empty
  find "$CLUSTER_DIR/hosts/$1/disk" -mindepth 1 -delete 2> /dev/null
  [ -z "$(ls -A "$CLUSTER_DIR/hosts/$1/disk")" ]
}

cluster_rate() {
  local host=$1 rate=$2 veth ns
  veth=$(cluster_host_var "$host" veth)
  ns=$(cluster_host_var "$host" netns)
  if [ "$rate" = off ]; then
    tc qdisc del dev "$veth" root 2> /dev/null
    ip netns exec "$ns" tc qdisc del dev eth0 root 2> /dev/null
    return 0
  fi
  # Both ways: what the bridge sends to the host, and what the host sends.
  tc qdisc replace dev "$veth" root tbf rate "$rate" burst 64kb latency 200ms &&
    ip netns exec "$ns" tc qdisc replace dev eth0 root tbf rate "$rate" burst 64kb latency 200ms
}

# Each host of one group discards what it sends to the other (blackhole routes in its namespace): the two groups
# no longer reach each other, in either direction, while a rate limit on the link stays as it is.
cluster_drop_to() {
  local ns address
  ns=$(cluster_host_var "$1" netns)
  shift
  for address in "$@"; do
    ip -n "$ns" route replace blackhole "$address/32" || cluster_fail "ip route blackhole in $ns failed"
  done
}
cluster_partition() {
  local a=() b=() h side=a
  for h in "$@"; do
    if [ "$h" = -- ]; then side=b; elif [ $side = a ]; then a+=("$h"); else b+=("$h"); fi
  done
  [ ${#a[@]} -gt 0 ] && [ ${#b[@]} -gt 0 ] || cluster_fail "usage: cluster_partition HOST... -- HOST..."
  local from_a=() from_b=()
  for h in "${a[@]}"; do from_a+=("$(cluster_host_var "$h" address)"); done
  for h in "${b[@]}"; do from_b+=("$(cluster_host_var "$h" address)"); done
  for h in "${a[@]}"; do cluster_drop_to "$h" "${from_b[@]}"; done
  for h in "${b[@]}"; do cluster_drop_to "$h" "${from_a[@]}"; done
}
cluster_unpartition() {
  local dir
  for dir in "$CLUSTER_DIR"/hosts/*/; do ip -n "$(cat "$dir/netns")" route flush type blackhole 2> /dev/null; done
  return 0
}

cluster_exec() {
  local host=$1
  shift
  "$CLUSTER_SOURCE_DIR/rsh_agent.sh" "$host" "$*"
}

# Every process started with this cluster in its environment (mpirun, the agents, what they started), but
# this shell; read with builtins only, so that the scan itself starts no process that would match.
cluster_tagged_pids() {
  local f pid entry
  for f in /proc/[0-9]*/environ; do
    pid=${f#/proc/}
    pid=${pid%/environ}
    [ "$pid" = $$ ] || [ "$pid" = "$BASHPID" ] && continue
    {
      while IFS= read -r -d '' entry; do
        if [ "$entry" = "MOE_CLUSTER_DIR=$CLUSTER_DIR" ]; then
          echo "$pid"
          break
        fi
      done < "$f"
    } 2> /dev/null
  done
}

# Tears down what the state files under $CLUSTER_DIR name; says what it could not remove (exit 1).
cluster_teardown() {
  [ -n "${CLUSTER_DIR:-}" ] && [ -d "$CLUSTER_DIR" ] || return 0
  local dir ns veth pid pids left=0 round
  for round in $(seq 1 20); do
    pids=$(cluster_tagged_pids)
    [ -z "$pids" ] && break
    for pid in $pids; do kill -KILL "$pid" 2> /dev/null; done
    sleep 0.1
  done
  for dir in "$CLUSTER_DIR"/hosts/*/; do
    ns=$(cat "$dir/netns" 2> /dev/null) || continue
    for round in $(seq 1 50); do
      pids=$(ip netns pids "$ns" 2> /dev/null)
      [ -z "$pids" ] && break
      for pid in $pids; do kill -KILL "$pid" 2> /dev/null; done
      sleep 0.1
    done
    veth=$(cat "$dir/veth" 2> /dev/null)
    ip link del "$veth" 2> /dev/null
    ip netns del "$ns" 2> /dev/null
    if ip netns list | grep -qw "$ns"; then
      echo "cluster: could not delete network namespace $ns" >&2
      left=1
    fi
  done
  local bridge
  bridge=$(cat "$CLUSTER_DIR/bridge" 2> /dev/null)
  if [ -n "$bridge" ]; then
    ip link del "$bridge" 2> /dev/null
    if ip link show "$bridge" > /dev/null 2>&1; then
      echo "cluster: could not delete bridge $bridge" >&2
      left=1
    fi
  fi
  umount "$CLUSTER_DIR/local" 2> /dev/null
  rm -rf "$CLUSTER_DIR"
  return $left
}

cluster_down() {
  local rc=0
  trap - EXIT
  [ -n "${CLUSTER_DIR:-}" ] || return $rc
  local reaper
  reaper=$(cat "$CLUSTER_DIR/reaper.pid" 2> /dev/null)
  [ -n "$reaper" ] && kill "$reaper" 2> /dev/null
  umount /etc/hosts 2> /dev/null
  cluster_teardown || rc=1
  CLUSTER_DIR=
  return $rc
}

# The EXIT trap: tears down, and a cluster that could not be removed fails the test.
cluster_on_exit() {
  local rc=$?
  cluster_down || rc=1
  exit $rc
}
