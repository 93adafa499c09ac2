// What changed between the config a checkpoint was written with and the config resuming it, whether the
// change may be made, and the run's record of every start (RUN_DIR/config_history.jsonl).
//
// Some keys fix what the checkpoint means for the run: the model's shape, the routing that shaped its
// experts, the data and how it is cut into sequences and batches. Changing one while resuming gives a run
// that is neither the old one continued nor a new one, so it is refused unless the user names the key in
// --allow-config-change. Every other key (steps, learning rate and schedule, checkpointing, faults,
// layout, logging, router temperature, capacity, loss coefficients) may change; each change is printed
// and recorded.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace moe {

struct ConfigChange {
  std::string key;           // dotted, e.g. "optim.lr"
  nlohmann::json then, now;  // null where the key is absent
};

// Every leaf that differs (lists compared whole), in key order.
std::vector<ConfigChange> config_changes(const nlohmann::json& then, const nlohmann::json& now);
// Refuses (BadInput) to resume from `checkpoint_dir` when the data it was trained on (its manifest's
// "data", data_provenance) differs from `now`'s, naming each source that changed, unless `allowed`
// (--allow-data-change). A checkpoint without "data" (written before provenance) is not checked.
// Returns one line per change, for the record.
std::vector<std::string> check_data_change(const nlohmann::json& then, const nlohmann::json& now, bool allowed,
                                           const std::string& checkpoint_dir);

// Whether changing `key` on resume needs --allow-config-change.
bool change_needs_permission(const std::string& key);
// BadInput naming every change that needs permission and is not allowed (keys or their prefixes, e.g.
// "data" allows every data.* key).
void check_config_changes(const std::vector<ConfigChange>& changes, const std::vector<std::string>& allowed,
                          const std::string& checkpoint_dir);
// "optim.lr 0.003 -> 0.001, train.steps 300 -> 600"
std::string describe_changes(const std::vector<ConfigChange>& changes);
nlohmann::json changes_json(const std::vector<ConfigChange>& changes);

// Appends one line to RUN_DIR/config_history.jsonl (created if missing).
void append_config_history(const std::string& run_dir, const nlohmann::json& entry);

}  // namespace moe
