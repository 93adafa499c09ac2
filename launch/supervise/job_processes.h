// The processes of one launched job on this host, found and ended without trusting the process group
// alone: OpenMPI puts each rank in a process group of its own, a rank may leave its session (setsid), and
// ranks still starting have sent no heartbeat. A process belongs to the job when it descends from the
// supervisor (which makes itself its descendants' subreaper, so orphans stay descendants) or carries the
// job's heartbeat secret in its environment. The ranks among them (SIGTERM is forwarded to these) run
// this program, carry OMPI_COMM_WORLD_RANK, or were heard by heartbeat. Processes on other hosts (here: in
// another network namespace, as the test cluster's hosts are) are mpirun's to end. Children die with their supervisor:
// spawn_tied gives a child a parent-death signal (and hands it the run lock's descriptor, so the lock lives as long as
// the job), and a rank started under a supervisor dies with its mpirun (die_with_parent). Not here: deciding when to
// end a job (launch/supervise/supervisor.cpp).
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace moe {

// How spawn_tied starts a child.
struct TiedSpawn {
  int death_signal = SIGTERM;  // sent to the child when this process dies, however it dies (SIGKILL too)
  int keep_fd = -1;            // a descriptor the child keeps open across exec (the run lock's), or -1
  int output_fd = -1;          // the child's stdout and stderr, or -1 for ours
};

// Starts args[0] (searched in PATH) with `env`, in a process group of its own, with an empty signal mask
// and SIGINT and SIGTERM at their defaults, and PR_SET_PDEATHSIG set between fork and exec; a child whose
// parent died before that (getppid() no longer this process) exits at once. Returns its pid; BadInput
// naming the program when it cannot be started (exec's errno, passed back through a close-on-exec pipe).
pid_t spawn_tied(const std::vector<std::string>& args, const std::vector<std::string>& env, const TiedSpawn& how);

// For a process started by another that must not outlive it (a rank under moe launch): `sig` when the
// parent dies; when the parent already differs from `parent_at_start` (read first thing in main), or is
// init, it died in between and this process exits now with 128 + sig.
void die_with_parent(int sig, pid_t parent_at_start);

class JobProcesses {
 public:
  // Orphaned descendants are re-parented to this process instead of init (PR_SET_CHILD_SUBREAPER);
  // call once before starting any job.
  static void become_subreaper();

  JobProcesses(pid_t mpirun, std::string secret, std::string rank_program);

  // mpirun's exit code (128 + signal when killed) once it has ended, else nullopt. Reaps every other
  // child that has ended too (orphans re-parented here).
  std::optional<int> poll_mpirun();
  // A rank's pid from a heartbeat of this host (never signalled unless it belongs to the job).
  void note_rank(int64_t pid);
  // SIGUSR1, the ranks' request for a clean stop (and SIGCONT), to every rank of the job not yet sent one;
  // returns how many got it now.
  int64_t forward_stop();
  // True when no process of the job is left on this host (mpirun included).
  bool all_gone();

  struct EndReport {
    int64_t killed = 0;  // processes sent SIGKILL
    int64_t left = 0;    // processes of the job still alive when the report was made
  };
  // Ends everything: SIGKILL to the ranks and every other process of the job but mpirun at once, SIGTERM
  // to mpirun's group (so that it can end ranks on other hosts) and SIGKILL after `mpirun_grace_s` or when
  // `hurry()` says so; then waits (up to `verify_s`) until every known pid is gone (ESRCH) and the
  // process group is empty, killing again whatever still appears.
  EndReport end_all(double mpirun_grace_s, double verify_s, const std::function<bool()>& hurry);

 private:
  struct Proc {
    pid_t pid = 0, pgid = 0;
    bool rank = false;
  };
  std::vector<Proc> scan() const;  // the live processes of the job, mpirun included
  bool gone_for_good(pid_t pid) const;

  pid_t mpirun_;
  std::string secret_entry_;  // "MOE_HEARTBEAT_SECRET=<secret>"
  std::string rank_program_;
  std::optional<int> mpirun_code_;
  std::set<pid_t> noted_, termed_, seen_;
};

}  // namespace moe
