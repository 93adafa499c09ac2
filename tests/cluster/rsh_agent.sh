#!/usr/bin/env bash
# The cluster harness's ssh (tests/cluster/cluster.sh): OpenMPI's rsh agent (OMPI_MCA_plm_rsh_agent) and the
# way tests run a command on a host. Called as ssh is, `rsh_agent.sh [OPTIONS] HOST COMMAND...`: options are
# ignored, the words of COMMAND are joined by spaces and run by sh on HOST, in HOST's namespaces (network,
# hostname, mount), in the home directory, with a login's clean environment (PATH, HOME, USER, SHELL and what the
# machine sets for every process, OPENBLAS_*, as hosts of one machine image have it: what mpirun wants the ranks to
# have it must pass itself, as with ssh). As ssh fails, so does this: an
# unknown host is exit 255 at once; a host cut off the network, frozen or gone is exit 255 after the connect
# timeout (MOE_CLUSTER_CONNECT_TIMEOUT seconds, 5 by default).
set -u

while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
if [ $# -lt 1 ]; then
  echo "usage: $0 [OPTIONS] HOST COMMAND..." >&2
  exit 255
fi
host=$1
shift
dir="${MOE_CLUSTER_DIR:-}/hosts/$host"
if [ -z "${MOE_CLUSTER_DIR:-}" ] || [ ! -d "$dir" ]; then
  echo "ssh: Could not resolve hostname $host: Name or service not known" >&2
  exit 255
fi

unreachable() {
  sleep "${MOE_CLUSTER_CONNECT_TIMEOUT:-5}"
  echo "ssh: connect to host $host port 22: Connection timed out ($1)" >&2
  exit 255
}
holder=$(cat "$dir/holder")
# The link as the host sees it (its end of the veth has no carrier when the bridge's end is down), read in the
# host's namespaces: the agent runs on the login node and on the hosts (a probe from a Slurm batch host) alike.
carrier=$(nsenter --target "$holder" --net --mount cat /sys/class/net/eth0/carrier 2> /dev/null) ||
  unreachable "its link is gone"
[ "$carrier" = 1 ] || unreachable "its link is down"
state=$(awk '/^State:/ {print $2}' "/proc/$holder/status" 2> /dev/null) || unreachable "the host is down"
[ "$state" != T ] || unreachable "the host is frozen"

# The machine-wide settings a login on a host of the login node's machine image has (cluster_up recorded them).
machine=()
while IFS= read -r setting; do machine+=("$setting"); done < <(cat "$MOE_CLUSTER_DIR/machine_env" 2> /dev/null)
exec nsenter --target "$holder" --net --uts --mount -- \
  env -i PATH="$PATH" HOME="${HOME:-/root}" USER="$(id -un)" LOGNAME="$(id -un)" SHELL=/bin/sh "${machine[@]}" \
  sh -c 'cd "$HOME" 2>/dev/null; eval "$1"' sh "$*"
