// Probing the hosts of `moe launch --hostfile` before every start and restart: each host, all at once and within
// a bounded time, must be reachable through mpirun's remote shell (its rsh agent: ssh unless OpenMPI's
// plm_rsh_agent says otherwise), start a process there, find this program at its path, and have disk space
// where the run writes. A host that fails is named with the reason. Not here: what the supervisor does with a
// failed host (launch/supervise/host_pool.h, launch/supervise/supervisor.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moe {

struct ProbeSpec {
  std::vector<std::string> agent;  // the remote shell and its options; the host and a command line follow
  std::string program;             // must be an executable file on every host
  std::string disk;                // a directory (or, when it does not exist yet, its nearest existing parent)
  int64_t min_free_bytes = 0;      // on the file system of `disk`, on every host
  double timeout_s = 10;           // for all hosts together: a host not done by then fails
  // Each host also tries a TCP connection to every other probed host (port 22, ssh's; a refusal counts as reached,
  // since it came back), twice within a third of timeout_s, so that a partition between hosts is seen.
  bool check_peers = true;
  // Non-empty: mpirun and its options. Each host that passes the checks above then runs `true` through its own
  // mpirun (`--host HOST:1 -np 1`), all at once within timeout_s, so that a host where mpirun cannot start its
  // daemon (a broken or mismatched MPI there) is named. Used after a start that failed before every host's ranks
  // reported: the only evidence mpirun gives of which host it was is a message meant for people.
  std::vector<std::string> daemon_check;
};

struct HostProbe {
  std::string host;
  bool ok = false;
  std::string reason;  // why it failed: unreachable, no answer within the time, program missing, disk full
  double seconds = 0;
  std::vector<std::string> unreachable_peers;  // probed hosts this one could not reach (it may be fine itself)
  std::string peer_errors;                     // what the connections to them said
};

// mpirun's remote shell, as OpenMPI chooses it: `--mca plm_rsh_agent X` among `mpirun_args`, else the
// OMPI_MCA_plm_rsh_agent environment variable, else ssh (the first of "A : B" alternatives). ssh gets
// BatchMode (no password prompt) and a ConnectTimeout within `timeout_s`.
std::vector<std::string> rsh_agent_command(const std::vector<std::string>& mpirun_args, double timeout_s);

// Probes every host at once; a host that is this machine (launch/supervise/hosts.h) is probed without the remote shell.
// Each host's peers are the other hosts of `hosts`.
std::vector<HostProbe> probe_hosts(const std::vector<std::string>& hosts, const ProbeSpec& spec);

}  // namespace moe
