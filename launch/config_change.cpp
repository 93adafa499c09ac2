// Config changes on resume, and the run's history of starts.
#include "launch/config_change.h"

#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "launch/config_schema.h"

namespace moe {
namespace {

using json = nlohmann::json;

void flatten(const json& j, const std::string& prefix, std::map<std::string, json>& out) {
  if (j.is_object()) {
    for (const auto& [k, v] : j.items()) flatten(v, prefix.empty() ? k : prefix + "." + k, out);
  } else {
    out[prefix] = j;
  }
}

bool has_prefix(const std::string& key, const std::string& prefix) {
  return key == prefix ||
         (key.size() > prefix.size() && key.compare(0, prefix.size(), prefix) == 0 && key[prefix.size()] == '.');
}

}  // namespace

std::vector<ConfigChange> config_changes(const json& then, const json& now) {
  std::map<std::string, json> a, b;
  flatten(then, "", a);
  flatten(now, "", b);
  std::vector<ConfigChange> changes;
  for (const auto& [key, value] : b) {
    const auto it = a.find(key);
    // A key added by a later version, at its default, changes nothing the checkpoint was written with.
    const config_schema::KeySpec* spec = config_schema::find_key(key);
    if (it == a.end() && spec && spec->default_value == value) continue;
    const json old = it == a.end() ? json() : it->second;
    if (old != value) changes.push_back({key, old, value});
  }
  for (const auto& [key, value] : a)
    if (!b.count(key)) changes.push_back({key, value, json()});
  std::sort(changes.begin(), changes.end(), [](const ConfigChange& x, const ConfigChange& y) { return x.key < y.key; });
  return changes;
}

bool change_needs_permission(const std::string& key) {
  static const char* const kFixed[] = {"model",
                                       "data",
                                       "train.seq_len",
                                       "train.seed",
                                       "train.global_batch",
                                       "train.micro_batch",
                                       "moe.num_experts",
                                       "moe.top_k",
                                       "moe.every",
                                       "moe.expert_hidden",
                                       "moe.shared_experts",
                                       "moe.fallback_hidden",
                                       "moe.router.score",
                                       "moe.router.normalize"};
  for (const char* prefix : kFixed)
    if (has_prefix(key, prefix)) return true;
  return false;
}

void check_config_changes(const std::vector<ConfigChange>& changes, const std::vector<std::string>& allowed,
                          const std::string& checkpoint_dir) {
  std::vector<ConfigChange> refused;
  for (const ConfigChange& c : changes) {
    if (!change_needs_permission(c.key)) continue;
    bool ok = false;
    for (const std::string& a : allowed) ok = ok || has_prefix(c.key, a);
    if (!ok) refused.push_back(c);
  }
  if (refused.empty()) return;
  std::string keys;
  for (const ConfigChange& c : refused) keys += (keys.empty() ? "" : ",") + c.key;
  MOE_BAD_INPUT("resuming from " << checkpoint_dir << " with " << describe_changes(refused)
                                 << ": these keys fix what the checkpoint means for the run (model, routing, data, "
                                    "sequences and batches). Resume with the values it was written with, start a "
                                    "new run (another --run-dir, or --resume none --overwrite), or say the change "
                                    "is meant: --allow-config-change "
                                 << keys);
}

std::string describe_changes(const std::vector<ConfigChange>& changes) {
  std::string text;
  for (const ConfigChange& c : changes)
    text += (text.empty() ? "" : ", ") + c.key + " " + (c.then.is_null() ? "(unset)" : c.then.dump()) + " -> " +
            (c.now.is_null() ? "(unset)" : c.now.dump());
  return text;
}

json changes_json(const std::vector<ConfigChange>& changes) {
  json out = json::array();
  for (const ConfigChange& c : changes) out.push_back({{"key", c.key}, {"from", c.then}, {"to", c.now}});
  return out;
}

void append_config_history(const std::string& run_dir, const json& entry) {
  const std::string path = (std::filesystem::path(run_dir) / "config_history.jsonl").string();
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (!f) MOE_FAIL("cannot open " << path << " for appending");
  const std::string text = entry.dump() + "\n";
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0;
  std::fclose(f);
  if (!ok) MOE_FAIL("cannot write " << path);
}

}  // namespace moe
