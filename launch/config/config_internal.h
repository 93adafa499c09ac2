// What the config loader's files share, private to launch/: the entries read from the file, the --set
// overrides and the defaults (launch/config/config.cpp), the typed structs filled from them
// (launch/config/config_fill.cpp), and the rules between keys checked on them (launch/config/config_rules.cpp). Not for
// code outside moe_config.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launch/config/config.h"
#include "launch/config/config_schema.h"

namespace moe::config_detail {

using json = nlohmann::json;

// One key's value and where it came from: a file path, "--set KEY=VALUE" or "default".
struct Entry {
  json value;
  std::string origin;
};
using Entries = std::map<std::string, Entry>;

// The typed structs and `resolved` from the complete (defaults filled) entries (launch/config/config_fill.cpp).
Config fill(const Entries& entries);

// ---- Rules between keys: each states its reason, and docs/config.md lists them. -------------------

struct Checked {
  const Config& config;
  const Entries& entries;
  // "model.heads = 3 (in --set model.heads=3)": the value and where it came from, for messages.
  std::string show(const std::string& key) const {
    const Entry& e = entries.at(key);
    return key + " = " + config_schema::show_value(e.value) + " (" +
           (e.origin == "default" ? "default" : "in " + e.origin) + ")";
  }
};

struct Rule {
  const char* doc;
  void (*check)(const Checked&);
};

// The rules between keys, in docs/config.md's order, and the gates of features this build does not have
// yet (launch/config/config_rules.cpp).
const std::vector<Rule>& rules();
const std::vector<Rule>& gates();

}  // namespace moe::config_detail
