// What the config tests share (test_config.cpp, test_config_rules.cpp, test_config_run_dir.cpp): a config
// loaded from a document in memory, a document holding one dotted key, and the check that a call is refused
// as bad input with every expected part in its message.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "launch/config/config.h"

namespace moe::config_test {

using json = nlohmann::json;

// Runs `load`, expects a BadInput whose message contains every one of `parts`.
inline void expect_bad_input(const std::function<void()>& load, const std::vector<std::string>& parts) {
  try {
    load();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::BadInput) << e.message();
    for (const std::string& part : parts)
      EXPECT_NE(e.message().find(part), std::string::npos) << "message lacks '" << part << "':\n" << e.message();
    return;
  }
  ADD_FAILURE() << "no error; expected one mentioning " << (parts.empty() ? "" : parts[0]);
}

inline Config from(const json& document, const std::vector<std::string>& overrides = {}) {
  return config_from_json(document, overrides, "test.json");
}

// {"a": {"b": value}} from "a.b".
inline json document_with(const std::string& key, const json& value) {
  std::string pointer = "/" + key;
  std::replace(pointer.begin(), pointer.end(), '.', '/');
  json document = json::object();
  document[json::json_pointer(pointer)] = value;
  return document;
}

}  // namespace moe::config_test
