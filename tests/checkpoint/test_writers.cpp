// Who writes a replicated tensor (checkpoint/writers.h): one member of its replica group each, the bytes
// balanced across the members, the same assignment whatever the order of the list's equal items.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/writers.h"

namespace moe::ckpt {
namespace {

std::vector<int64_t> bytes_per_member(const std::vector<std::pair<std::string, int64_t>>& items,
                                      const std::vector<int>& writer, int members) {
  std::vector<int64_t> load(size_t(members), 0);
  for (size_t i = 0; i < items.size(); ++i) {
    EXPECT_GE(writer[i], 0);
    EXPECT_LT(writer[i], members);
    load[size_t(writer[i])] += items[i].second;
  }
  return load;
}

TEST(AssignWriters, FourMembersWriteAQuarterEach) {
  // A model's replicated tensors: a few large ones and many small ones.
  std::vector<std::pair<std::string, int64_t>> items = {{"params/embed.weight", 256 * 128 * 4},
                                                        {"params/head.weight", 256 * 128 * 4}};
  for (int l = 0; l < 4; ++l)
    for (const char* w : {"wq", "wk", "wv", "wo"})
      items.emplace_back("params/layers." + std::to_string(l) + ".attn." + w, 128 * 128 * 4);
  for (int l = 0; l < 4; ++l) items.emplace_back("params/layers." + std::to_string(l) + ".attn_norm.gain", 128 * 4);
  items.emplace_back("optim/step", 8);
  const std::vector<int> writer = assign_writers(items, 4);
  const std::vector<int64_t> load = bytes_per_member(items, writer, 4);
  int64_t total = 0;
  for (int64_t b : load) total += b;
  for (int64_t b : load) {
    EXPECT_GT(b, 0);
    EXPECT_LE(b, total / 4 + 128 * 128 * 4) << "no member writes more than a quarter and one tensor";
  }
}

TEST(AssignWriters, OneMemberWritesEverythingAndNoItemsIsFine) {
  const std::vector<std::pair<std::string, int64_t>> items = {{"a", 4}, {"b", 8}};
  EXPECT_EQ(assign_writers(items, 1), (std::vector<int>{0, 0}));
  EXPECT_TRUE(assign_writers({}, 4).empty());
}

TEST(AssignWriters, TheAssignmentIsAFunctionOfTheItemsNotOfTheirOrder) {
  std::mt19937 rng(7);
  std::vector<std::pair<std::string, int64_t>> items;
  for (int i = 0; i < 40; ++i) items.emplace_back("t" + std::to_string(i), int64_t(rng() % 5) * 16);  // many ties
  const std::vector<int> writer = assign_writers(items, 3);
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<std::pair<std::string, int64_t>> shuffled;
  for (size_t i : order) shuffled.push_back(items[i]);
  const std::vector<int> again = assign_writers(shuffled, 3);
  for (size_t k = 0; k < order.size(); ++k) EXPECT_EQ(again[k], writer[order[k]]) << shuffled[k].first;
}

}  // namespace
}  // namespace moe::ckpt
