// Shrinking after repeated host failures (fault.shrink): which hosts and how many ranks the supervisor
// restarts with, and when it refuses because the config does not fit the smaller world.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "launch/config/config.h"
#include "launch/supervise/supervisor.h"

namespace moe {
namespace {

Config config_with(const std::vector<std::string>& overrides) {
  return config_from_json(nlohmann::json::object(), overrides, "test");
}

TEST(Shrink, LeavesOutAHostThatFailedTwice) {
  const std::vector<HostSlots> hosts = {{"a", 2}, {"b", 2}};
  const Config c = config_with({"train.global_batch=8", "train.micro_batch=2", "moe.num_experts=4", "parallel.ep=2"});
  std::string why;
  EXPECT_FALSE(plan_shrink(hosts, "b", 1, 4, c, &why));
  EXPECT_NE(why.find("shrinking takes 2"), std::string::npos);
  const auto plan = plan_shrink(hosts, "b", 2, 4, c, &why);
  ASSERT_TRUE(plan) << why;
  EXPECT_EQ(plan->np, 2);
  ASSERT_EQ(plan->hosts.size(), 1u);
  EXPECT_EQ(plan->hosts[0].name, "a");
}

TEST(Shrink, RefusesWhenTheConfigDoesNotFitTheSmallerWorld) {
  const std::vector<HostSlots> hosts = {{"a", 3}, {"b", 1}};
  std::string why;
  // 3 ranks left: global_batch 8 does not split over dp 3.
  EXPECT_FALSE(plan_shrink(hosts, "b", 2, 4, config_with({"train.global_batch=8", "train.micro_batch=2"}), &why));
  EXPECT_NE(why.find("train.global_batch"), std::string::npos) << why;
  // ep = 4 does not fit 3 ranks.
  EXPECT_FALSE(plan_shrink(
      hosts, "b", 2, 4,
      config_with({"train.global_batch=12", "train.micro_batch=1", "moe.num_experts=8", "parallel.ep=4"}), &why));
  EXPECT_NE(why.find("parallel.ep"), std::string::npos) << why;
  // A host that is not in the hostfile, or the only host, is never left out.
  EXPECT_FALSE(plan_shrink({{"a", 4}}, "a", 5, 4, config_with({}), &why));
  EXPECT_FALSE(plan_shrink(hosts, "c", 5, 4, config_with({}), &why));
}

TEST(Shrink, ReadsHostfiles) {
  const auto path = std::filesystem::temp_directory_path() / "moe_test_hostfile";
  std::ofstream(path) << "# cluster\nnode1 slots=8\n\nnode2   slots=4 # the small one\nnode3\n";
  const auto hosts = read_hostfile(path.string());
  ASSERT_EQ(hosts.size(), 3u);
  EXPECT_EQ(hosts[0].name, "node1");
  EXPECT_EQ(hosts[0].slots, 8);
  EXPECT_EQ(hosts[1].slots, 4);
  EXPECT_EQ(hosts[2].slots, 1);
  std::ofstream(path) << "# nothing\n";
  EXPECT_THROW(read_hostfile(path.string()), Error);
  std::filesystem::remove(path);
  EXPECT_THROW(read_hostfile(path.string()), Error);
}

}  // namespace
}  // namespace moe
