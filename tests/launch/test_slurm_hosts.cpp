// The hosts of a Slurm allocation (launch/supervise/slurm_hosts.h): compressed node lists and task counts expanded as
// Slurm writes them, the variables Slurm falls back on, and malformed values refused naming the variable.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "launch/supervise/slurm_hosts.h"

namespace moe {
namespace {

using Strings = std::vector<std::string>;

TEST(SlurmHosts, NodeListsExpandAsSlurmWritesThem) {
  EXPECT_EQ(expand_slurm_nodelist("mh1", "L"), (Strings{"mh1"}));
  EXPECT_EQ(expand_slurm_nodelist("node[01-03,7],login2", "L"),
            (Strings{"node01", "node02", "node03", "node7", "login2"}));
  EXPECT_EQ(expand_slurm_nodelist("rack[1-2]-n[8-9]", "L"), (Strings{"rack1-n8", "rack1-n9", "rack2-n8", "rack2-n9"}));
  EXPECT_EQ(expand_slurm_nodelist("gpu[098-101]", "L"), (Strings{"gpu098", "gpu099", "gpu100", "gpu101"}));
}

TEST(SlurmHosts, CountsExpand) {
  EXPECT_EQ(expand_slurm_counts("2(x3),1", "C"), (std::vector<int64_t>{2, 2, 2, 1}));
  EXPECT_EQ(expand_slurm_counts("8", "C"), (std::vector<int64_t>{8}));
}

TEST(SlurmHosts, MalformedValuesAreRefusedNamingTheVariable) {
  for (const char* list : {"node[1-", "node[3-1]", "node[a-b]", "a,,b", "node]1["}) {
    try {
      expand_slurm_nodelist(list, "SLURM_JOB_NODELIST");
      ADD_FAILURE() << list;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::BadInput);
      EXPECT_NE(e.message().find("SLURM_JOB_NODELIST"), std::string::npos) << e.message();
    }
  }
  for (const char* counts : {"2(x)", "x", "0", "2(3)"}) EXPECT_THROW(expand_slurm_counts(counts, "C"), Error) << counts;
}

TEST(SlurmHosts, TheAllocationsHostsWithTheirSlots) {
  EXPECT_FALSE(slurm_hosts({}));  // outside an allocation
  const auto hosts = slurm_hosts({{"SLURM_JOB_NODELIST", "mh[1-3]"}, {"SLURM_TASKS_PER_NODE", "2(x2),1"}});
  ASSERT_TRUE(hosts);
  ASSERT_EQ(hosts->size(), 3u);
  EXPECT_EQ((*hosts)[0].name, "mh1");
  EXPECT_EQ((*hosts)[1].slots, 2);
  EXPECT_EQ((*hosts)[2].name, "mh3");
  EXPECT_EQ((*hosts)[2].slots, 1);
  // Older variable names, and one slot per node without counts.
  const auto older = slurm_hosts({{"SLURM_NODELIST", "a,b"}});
  ASSERT_TRUE(older);
  EXPECT_EQ(older->size(), 2u);
  EXPECT_EQ((*older)[1].slots, 1);
  EXPECT_THROW(slurm_hosts({{"SLURM_JOB_NODELIST", "mh[1-3]"}, {"SLURM_TASKS_PER_NODE", "2(x2)"}}), Error);
}

}  // namespace
}  // namespace moe
