// The hosts of a Slurm allocation, for `moe launch` run inside one without --hostfile: the node list
// (SLURM_JOB_NODELIST, in Slurm's compressed form "node[01-03,7],login2") and the tasks per node
// (SLURM_TASKS_PER_NODE, "2(x3),1"), as hostfile entries in the allocation's order. Not here: what the supervisor
// does with hosts (launch/supervise/supervisor.cpp).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "launch/supervise/supervisor.h"

namespace moe {

// "node[01-03,7],login2" -> node01 node02 node03 node7 login2 (zero padding kept). BadInput naming `what` when
// malformed.
std::vector<std::string> expand_slurm_nodelist(const std::string& list, const std::string& what);
// "2(x3),1" -> 2 2 2 1. BadInput naming `what` when malformed.
std::vector<int64_t> expand_slurm_counts(const std::string& counts, const std::string& what);
// The allocation's hosts from `env` (SLURM_JOB_NODELIST or SLURM_NODELIST; slots from SLURM_TASKS_PER_NODE, else
// SLURM_JOB_CPUS_PER_NODE, else 1), or nullopt outside an allocation. BadInput naming the variable when it is
// malformed or the counts do not match the nodes.
std::optional<std::vector<HostSlots>> slurm_hosts(const std::map<std::string, std::string>& env);

}  // namespace moe
