// Config changes on resume, and the run's history of starts.
#include "launch/train/config_change.h"

#include <cstdio>
#include <filesystem>
#include <map>

#include "core/error.h"
#include "launch/config/config_schema.h"
#include "launch/run/run_files.h"

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
    // A key added since the checkpoint was written, at its default, means what the old config meant.
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

std::vector<std::string> check_data_change(const json& then, const json& now, bool allowed,
                                           const std::string& checkpoint_dir) {
  if (then.is_null() || !then.contains("xxh64") || then.at("xxh64") == now.at("xxh64")) return {};
  auto by_name = [](const json& provenance) {
    std::map<std::string, json> out;
    for (const json& s : provenance.value("sources", json::array())) out[s.value("name", "")] = s;
    return out;
  };
  const std::map<std::string, json> a = by_name(then), b = by_name(now);
  std::vector<std::string> lines;
  auto describe = [](const json& s) {
    return s.value("kind", "?") + " " + s.value("path", "?") + " (xxh64 " + s.value("xxh64", "?") + ", tokenizer " +
           s.value("tokenizer", "?") + " " + s.value("tokenizer_xxh64", "?") + ")";
  };
  for (const auto& [name, s] : b) {
    const auto it = a.find(name);
    if (it == a.end())
      lines.push_back("source '" + name + "' is new: " + describe(s));
    else if (it->second.value("xxh64", "") != s.value("xxh64", "") ||
             it->second.value("tokenizer_xxh64", "") != s.value("tokenizer_xxh64", ""))
      lines.push_back("source '" + name + "' was " + describe(it->second) + ", now " + describe(s));
  }
  for (const auto& [name, s] : a)
    if (!b.count(name)) lines.push_back("source '" + name + "' is gone: it was " + describe(s));
  if (lines.empty()) lines.push_back("the sources' order or kinds changed");
  if (!allowed) {
    std::string text;
    for (const std::string& line : lines) text += "\n  " + line;
    MOE_BAD_INPUT("checkpoint " << checkpoint_dir << " was trained on other data (data xxh64 "
                                << then.at("xxh64").get<std::string>() << ", now " << now.at("xxh64").get<std::string>()
                                << "):" << text
                                << "\nresume with --allow-data-change if this is meant, or start a new run");
  }
  return lines;
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
  std::FILE* f = open_run_file(path, FileMode::Append);
  try {
    // The command line is the user's bytes; a name that is not UTF-8 is recorded with U+FFFD in its place.
    write_all(f, entry.dump(-1, ' ', false, json::error_handler_t::replace) + "\n", path);
  } catch (...) {
    std::fclose(f);
    throw;
  }
  std::fclose(f);
}

}  // namespace moe
