// The config schema: one entry per dotted key (type, default, allowed values, one-line doc), the check of
// one value against its entry, and the nearest-key suggestion for unknown keys. It knows nothing of files,
// --set or the rules between keys (launch/config/config.cpp, launch/config/config_rules.cpp); it only judges one key at
// a time.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace moe::config_schema {

enum class KeyType : uint8_t {
  Integer,  // a JSON integer: 3.0 and "3" are type errors
  Number,   // any finite JSON number, integers included
  Boolean,
  Choice,         // a string from `choices`
  String,         // a non-empty string
  IntegerOrAuto,  // an integer in `range`, or the string "auto"
  Sources,        // data.sources: a list of {"name", "path", "weight"} objects
  StringList,     // a list of non-empty strings
  IntegerList,    // a list of integers in `range`
  Faults,         // fault.inject: a list of {"kind", "rank", "step"} objects
  Schedule,       // data.schedule: a list of {"step", "weights": {source: weight}} objects
  ChoiceList,     // a string from `choices`, or a non-empty list of them (moe.overflow's cascade)
  TauSchedule,    // a list of {"step": integer >= 0, "tau": number in `range`} with increasing steps
};

// Bounds of a numeric key; an infinite bound is no bound.
struct Range {
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  bool min_open = false;  // min itself is excluded
  bool max_open = false;
};

struct KeySpec {
  std::string key;  // dotted: "moe.router.tau"
  KeyType type;
  nlohmann::json default_value;
  Range range;
  std::vector<std::string> choices;
  std::string doc;
};

// Every key, in the order docs/config.md lists them.
const std::vector<KeySpec>& schema();
// Top-level sections with their one-line description, in order.
struct SectionSpec {
  std::string name;
  std::string doc;
};
const std::vector<SectionSpec>& sections();

// nullptr when `key` is not a leaf key.
const KeySpec* find_key(const std::string& key);
// True for "moe", "moe.router", "moe.router.bias_balance": every proper prefix of a key.
bool is_section(const std::string& path);
// The direct children of a section ("" = top level), leaf names and subsection names, in schema order.
std::vector<std::string> section_children(const std::string& section);
// The valid key or section most likely meant by `unknown`; empty when nothing is close.
std::string nearest_key(const std::string& unknown);
// Edit distance counting adjacent transpositions as one edit; also used for source-object fields.
size_t edit_distance(const std::string& a, const std::string& b);

// "an integer >= 1", "one of \"gumbel\", \"none\"": what a value of this key must be.
std::string describe_expected(const KeySpec& spec);
// A JSON value as a user wrote it, shortened when long.
std::string show_value(const nlohmann::json& value);

// Checks one value against its key and returns it normalized (numbers as doubles, defaults filled into
// source objects). `origin` (a file path or "--set ...") goes into the message of the BadInput thrown.
nlohmann::json check_value(const KeySpec& spec, const nlohmann::json& value, const std::string& origin);

// The per-section key tables of docs/config.md.
std::string tables_markdown();

}  // namespace moe::config_schema
