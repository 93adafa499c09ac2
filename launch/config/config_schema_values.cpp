// The check of one config value against its key (launch/config/config_schema.h): types, ranges, choices and the
// lists of objects (data.sources, data.schedule, fault.inject, moe.router.tau_schedule), with a message
// naming the key, the value and what is expected; that expectation in words; and the key tables of
// docs/config.md. The table of keys itself is launch/config/config_schema.cpp.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "launch/config/config_schema.h"
#include "launch/config/config_schema_internal.h"

namespace moe::config_schema {
namespace {

using json = nlohmann::json;
using detail::kMaxSteps;

[[noreturn]] void bad_value(const KeySpec& spec, const std::string& key, const json& value, const std::string& origin,
                            const std::string& hint = "") {
  MOE_BAD_INPUT(key << " = " << show_value(value) << " (in " << origin << "): expected " << describe_expected(spec)
                    << hint);
}

bool in_range(const Range& r, double v) {
  const bool above_min = r.min_open ? v > r.min : v >= r.min;
  const bool below_max = r.max_open ? v < r.max : v <= r.max;
  return above_min && below_max;
}

// Numbers reach the model in single precision: a value float32 cannot hold (a magnitude beyond about 3.4e38,
// or so small that it would become 0) is refused, not turned into infinity or zero.
bool fits_float(double v) {
  const double magnitude = std::fabs(v);
  return magnitude == 0 ||
         (magnitude <= std::numeric_limits<float>::max() && magnitude >= std::numeric_limits<float>::min());
}
constexpr const char* kFloatHint = " (and 0 or a magnitude in [1.2e-38, 3.4e38], which float32 holds)";

std::string format_bound(double v) {
  // Integral bounds in full (99999999, not 1e+08): they are what a user types.
  if (std::floor(v) == v && std::fabs(v) < 1e15) return std::to_string(int64_t(v));
  std::ostringstream out;
  out << v;
  return out.str();
}

// ">= 1", "> 0", "in [0, 1)"; an integer key bounded both ways reads ">= 0 and <= 1024". Empty when
// unbounded.
std::string describe_range(const Range& r, bool integer = false) {
  const bool has_min = std::isfinite(r.min), has_max = std::isfinite(r.max);
  const std::string lower = (r.min_open ? "> " : ">= ") + format_bound(r.min);
  const std::string upper = (r.max_open ? "< " : "<= ") + format_bound(r.max);
  if (has_min && has_max && integer) return lower + " and " + upper;
  if (has_min && has_max)
    return "in " + std::string(r.min_open ? "(" : "[") + format_bound(r.min) + ", " + format_bound(r.max) +
           (r.max_open ? ")" : "]");
  if (has_min) return lower;
  if (has_max) return upper;
  return "";
}

std::string quoted_list(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "\"" : ", \"") + item + "\"";
  return out;
}

// One entry of data.sources: {"name": non-empty string, "path": non-empty string, "weight": number > 0}.
json check_source(const KeySpec& spec, const json& item, size_t index, const std::string& origin) {
  const std::string where = spec.key + "[" + std::to_string(index) + "]";
  if (!item.is_object())
    MOE_BAD_INPUT(where << " = " << show_value(item) << " (in " << origin
                        << "): expected an object {\"name\": string, \"path\": string, \"weight\": number > 0}");
  static const std::vector<std::string> kFields = {"name", "path", "weight"};
  for (const auto& [field, value] : item.items()) {
    if (std::find(kFields.begin(), kFields.end(), field) != kFields.end()) continue;
    std::string best = kFields[0];
    for (const std::string& f : kFields)
      if (edit_distance(field, f) < edit_distance(field, best)) best = f;
    MOE_BAD_INPUT("unknown key '" << where << "." << field << "' in " << origin << "; did you mean '" << where << "."
                                  << best << "'? (a source has name, path and weight)");
  }
  json out = json::object();
  for (const char* field : {"name", "path"}) {
    if (!item.contains(field))
      MOE_BAD_INPUT(where << " (in " << origin << ") has no \"" << field << "\": every source needs a name and a path");
    const json& value = item.at(field);
    if (!value.is_string() || value.get<std::string>().empty())
      MOE_BAD_INPUT(where << "." << field << " = " << show_value(value) << " (in " << origin
                          << "): expected a non-empty string");
    out[field] = value;
  }
  const json weight = item.value("weight", json(1.0));
  if (!weight.is_number() || !std::isfinite(weight.get<double>()) || weight.get<double>() <= 0)
    MOE_BAD_INPUT(where << ".weight = " << show_value(weight) << " (in " << origin << "): expected a number > 0");
  out["weight"] = weight.get<double>();
  return out;
}

// One point of data.schedule: {"step": integer >= 1, "weights": {name: number >= 0, at least one > 0}}.
json check_schedule_point(const KeySpec& spec, const json& item, size_t index, const std::string& origin) {
  const std::string where = spec.key + "[" + std::to_string(index) + "]";
  if (!item.is_object() || item.size() != 2 || !item.contains("step") || !item.contains("weights"))
    MOE_BAD_INPUT(where << " = " << show_value(item) << " (in " << origin
                        << "): expected {\"step\": integer >= 1, \"weights\": {\"source name\": number >= 0, ...}}");
  const json& step = item.at("step");
  if (!step.is_number_integer() || step.get<int64_t>() < 1 || step.get<int64_t>() > int64_t(kMaxSteps))
    MOE_BAD_INPUT(where << ".step = " << show_value(step) << " (in " << origin
                        << "): expected an integer >= 1 and <= " << format_bound(kMaxSteps));
  const json& weights = item.at("weights");
  if (!weights.is_object() || weights.empty())
    MOE_BAD_INPUT(where << ".weights = " << show_value(weights) << " (in " << origin
                        << "): expected an object of source names to weights, e.g. {\"prose\": 1, \"code\": 0.5}");
  double total = 0;
  json out_weights = json::object();
  for (const auto& [name, w] : weights.items()) {
    if (!w.is_number() || !std::isfinite(w.get<double>()) || w.get<double>() < 0 || w.get<double>() > 1e12)
      MOE_BAD_INPUT(where << ".weights." << name << " = " << show_value(w) << " (in " << origin
                          << "): expected a number >= 0 (and <= 1e12)");
    total += w.get<double>();
    out_weights[name] = w.get<double>();
  }
  if (!(total > 0))
    MOE_BAD_INPUT(where << ".weights (in " << origin << "): every weight is 0; expected at least one > 0");
  return {{"step", step.get<int64_t>()}, {"weights", out_weights}};
}

json check_schedule(const KeySpec& spec, const json& value, const std::string& origin) {
  if (!value.is_array()) bad_value(spec, spec.key, value, origin);
  json out = json::array();
  for (size_t i = 0; i < value.size(); ++i) {
    json point = check_schedule_point(spec, value[i], i, origin);
    if (i > 0 && point["step"].get<int64_t>() <= out[i - 1]["step"].get<int64_t>())
      MOE_BAD_INPUT(spec.key << "[" << i << "].step = " << point["step"].dump() << " (in " << origin
                             << "): expected steps in increasing order; " << spec.key << "[" << i - 1 << "].step is "
                             << out[i - 1]["step"].dump());
    out.push_back(std::move(point));
  }
  return out;
}

json check_sources(const KeySpec& spec, const json& value, const std::string& origin) {
  if (!value.is_array()) bad_value(spec, spec.key, value, origin);
  json out = json::array();
  double total_weight = 0;
  for (size_t i = 0; i < value.size(); ++i) {
    json source = check_source(spec, value[i], i, origin);
    // Names label eval_loss_by_source in metrics.jsonl, so two sources may not share one.
    for (size_t j = 0; j < i; ++j)
      if (out[j]["name"] == source["name"])
        MOE_BAD_INPUT(spec.key << "[" << i << "].name = " << source["name"].dump() << " (in " << origin
                               << "): expected a unique name, but " << spec.key << "[" << j
                               << "] has it too (names label eval_loss_by_source)");
    total_weight += source["weight"].get<double>();
    // The sampler draws from the running sum of the weights: past the largest double, one source takes all.
    if (!std::isfinite(total_weight))
      MOE_BAD_INPUT(spec.key << "[" << i << "].weight = " << source["weight"].dump() << " (in " << origin
                             << "): the weights' sum is past the largest number; expected weights whose sum is finite "
                                "(they are relative: scale them all down)");
    out.push_back(std::move(source));
  }
  return out;
}

bool is_choice(const KeySpec& spec, const json& item) {
  return item.is_string() &&
         std::find(spec.choices.begin(), spec.choices.end(), item.get<std::string>()) != spec.choices.end();
}

// A choice, or a non-empty list of distinct choices (their order is checked with the other keys).
json check_choice_list(const KeySpec& spec, const json& value, const std::string& origin) {
  if (is_choice(spec, value)) return value;
  if (!value.is_array() || value.empty()) bad_value(spec, spec.key, value, origin);
  for (size_t i = 0; i < value.size(); ++i) {
    if (!is_choice(spec, value[i])) bad_value(spec, spec.key, value, origin);
    for (size_t j = 0; j < i; ++j)
      if (value[j] == value[i]) bad_value(spec, spec.key, value, origin, " (" + value[i].dump() + " appears twice)");
  }
  return value;
}

// {"step": integer >= 0, "tau": number in range} points, steps increasing.
json check_tau_schedule(const KeySpec& spec, const json& value, const std::string& origin) {
  if (!value.is_array()) bad_value(spec, spec.key, value, origin);
  json out = json::array();
  for (size_t i = 0; i < value.size(); ++i) {
    const json& point = value[i];
    const std::string where = spec.key + "[" + std::to_string(i) + "]";
    if (!point.is_object() || point.size() != 2 || !point.contains("step") || !point.contains("tau"))
      MOE_BAD_INPUT(where << " = " << show_value(point) << " (in " << origin
                          << "): expected {\"step\": integer >= 0, \"tau\": number > 0}");
    const json &step = point["step"], &tau = point["tau"];
    if (!step.is_number_integer() || step.get<int64_t>() < 0)
      MOE_BAD_INPUT(where << ".step = " << show_value(step) << " (in " << origin << "): expected an integer >= 0");
    if (!tau.is_number() || !std::isfinite(tau.get<double>()) || !in_range(spec.range, tau.get<double>()) ||
        !fits_float(tau.get<double>()))
      MOE_BAD_INPUT(where << ".tau = " << show_value(tau) << " (in " << origin << "): expected a number "
                          << describe_range(spec.range) << kFloatHint);
    if (i > 0 && step.get<int64_t>() <= out.back()["step"].get<int64_t>())
      MOE_BAD_INPUT(where << ".step = " << show_value(step) << " (in " << origin << "): expected a step above "
                          << out.back()["step"].get<int64_t>() << ", the previous point's: steps increase");
    out.push_back({{"step", step.get<int64_t>()}, {"tau", tau.get<double>()}});
  }
  return out;
}

std::string escape_cell(const std::string& text) {
  std::string out;
  for (char c : text) out += (c == '|') ? std::string("\\|") : std::string(1, c);
  return out;
}

std::string type_name(const KeySpec& spec) {
  switch (spec.type) {
    case KeyType::Integer:
      return "integer";
    case KeyType::Number:
      return "number";
    case KeyType::Boolean:
      return "boolean";
    case KeyType::Choice:
      return "string";
    case KeyType::String:
      return "string";
    case KeyType::IntegerOrAuto:
      return "integer or `\"auto\"`";
    case KeyType::Sources:
      return "list of sources";
    case KeyType::StringList:
      return "list of strings";
    case KeyType::IntegerList:
      return "list of integers";
    case KeyType::Faults:
      return "list of faults";
    case KeyType::Schedule:
      return "list of schedule points";
    case KeyType::ChoiceList:
      return "string or list of strings";
    case KeyType::TauSchedule:
      return "list of points";
  }
  return "";
}

std::string allowed_cell(const KeySpec& spec) {
  if (spec.type == KeyType::Choice) {
    std::string out;
    for (const std::string& c : spec.choices) out += (out.empty() ? "`\"" : ", `\"") + c + "\"`";
    return out;
  }
  if (spec.type == KeyType::String) return "non-empty";
  if (spec.type == KeyType::Boolean) return "`true`, `false`";
  if (spec.type == KeyType::Sources) return "see above";
  if (spec.type == KeyType::StringList) return "non-empty strings";
  if (spec.type == KeyType::IntegerList) return "integers " + describe_range(spec.range, true);
  if (spec.type == KeyType::Faults || spec.type == KeyType::Schedule || spec.type == KeyType::TauSchedule)
    return "see Meaning";
  if (spec.type == KeyType::ChoiceList) {
    std::string out;
    for (const std::string& c : spec.choices) out += (out.empty() ? "`\"" : ", `\"") + c + "\"`";
    return out + ", or a list of them";
  }
  if (spec.type == KeyType::IntegerOrAuto) return describe_range(spec.range, true) + " or `\"auto\"`";
  const std::string range = describe_range(spec.range, spec.type == KeyType::Integer);
  return range.empty() ? "any" : range;
}

}  // namespace

std::string describe_expected(const KeySpec& spec) {
  const std::string range =
      describe_range(spec.range, spec.type == KeyType::Integer || spec.type == KeyType::IntegerOrAuto);
  switch (spec.type) {
    case KeyType::Integer:
      return range.empty() ? "an integer" : "an integer " + range;
    case KeyType::Number:
      return range.empty() ? "a number" : "a number " + range;
    case KeyType::Boolean:
      return "true or false";
    case KeyType::Choice:
      return "one of " + quoted_list(spec.choices);
    case KeyType::String:
      return "a non-empty string";
    case KeyType::IntegerOrAuto:
      return "an integer " + range + " or \"auto\"";
    case KeyType::Sources:
      return "a list of sources, each {\"name\": string, \"path\": string, \"weight\": number > 0}";
    case KeyType::StringList:
      return "a list of non-empty strings";
    case KeyType::IntegerList:
      return "a list of integers " + range;
    case KeyType::Faults:
      return "a list of faults, each {\"kind\": " + quoted_list(spec.choices) +
             ", \"rank\": integer >= 0, \"step\": integer >= 1}";
    case KeyType::Schedule:
      return "a list of points, each {\"step\": integer >= 1, \"weights\": {\"source name\": number >= 0, ...}}";
    case KeyType::ChoiceList:
      return "one of " + quoted_list(spec.choices) + ", or a non-empty list of them";
    case KeyType::TauSchedule:
      return "a list of {\"step\": integer >= 0, \"tau\": number " + range + "} with increasing steps";
  }
  return "";
}

std::string show_value(const json& value) {
  std::string text = value.dump();
  constexpr size_t kMaxChars = 80;
  if (text.size() > kMaxChars) text = text.substr(0, kMaxChars) + "...";
  return text;
}

json check_value(const KeySpec& spec, const json& value, const std::string& origin) {
  switch (spec.type) {
    case KeyType::Integer:
    case KeyType::IntegerOrAuto: {
      if (spec.type == KeyType::IntegerOrAuto && value == "auto") return value;
      if (!value.is_number_integer()) {
        // The two mistakes people make, named so the fix is obvious.
        std::string hint;
        const double as_double = value.is_number() ? value.get<double>() : 0.0;
        if (value.is_number_float() && std::floor(as_double) == as_double && std::fabs(as_double) < 1e15)
          hint = " (a JSON integer: write " + std::to_string(int64_t(as_double)) + ", not " + value.dump() + ")";
        else if (value.is_string())
          hint = " (a JSON integer, without quotes)";
        bad_value(spec, spec.key, value, origin, hint);
      }
      if (value.is_number_unsigned() && value.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
        bad_value(spec, spec.key, value, origin);
      const int64_t v = value.get<int64_t>();
      if (!in_range(spec.range, double(v))) bad_value(spec, spec.key, value, origin);
      return v;
    }
    case KeyType::Number: {
      if (!value.is_number() || !std::isfinite(value.get<double>())) bad_value(spec, spec.key, value, origin);
      const double v = value.get<double>();
      if (!in_range(spec.range, v)) bad_value(spec, spec.key, value, origin);
      if (!fits_float(v)) bad_value(spec, spec.key, value, origin, kFloatHint);
      return v;
    }
    case KeyType::Boolean:
      if (!value.is_boolean()) bad_value(spec, spec.key, value, origin);
      return value;
    case KeyType::Choice:
      if (!value.is_string() ||
          std::find(spec.choices.begin(), spec.choices.end(), value.get<std::string>()) == spec.choices.end())
        bad_value(spec, spec.key, value, origin);
      return value;
    case KeyType::String:
      if (!value.is_string() || value.get<std::string>().empty()) bad_value(spec, spec.key, value, origin);
      return value;
    case KeyType::Sources:
      return check_sources(spec, value, origin);
    case KeyType::Schedule:
      return check_schedule(spec, value, origin);
    case KeyType::StringList:
      if (!value.is_array()) bad_value(spec, spec.key, value, origin);
      for (const json& item : value)
        if (!item.is_string() || item.get<std::string>().empty()) bad_value(spec, spec.key, value, origin);
      return value;
    case KeyType::IntegerList:
      if (!value.is_array()) bad_value(spec, spec.key, value, origin);
      for (const json& item : value)
        if (!item.is_number_integer() ||
            (item.is_number_unsigned() && item.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())) ||
            !in_range(spec.range, double(item.get<int64_t>())))
          bad_value(spec, spec.key, value, origin);
      return value;
    case KeyType::ChoiceList:
      return check_choice_list(spec, value, origin);
    case KeyType::TauSchedule:
      return check_tau_schedule(spec, value, origin);
    case KeyType::Faults: {
      if (!value.is_array()) bad_value(spec, spec.key, value, origin);
      for (size_t i = 0; i < value.size(); ++i) {
        const json& f = value[i];
        const std::string where = spec.key + "[" + std::to_string(i) + "]";
        if (!f.is_object() || f.size() != 3 || !f.contains("kind") || !f.contains("rank") || !f.contains("step"))
          MOE_BAD_INPUT(where << " = " << show_value(f) << " (in " << origin
                              << "): expected {\"kind\": ..., \"rank\": ..., \"step\": ...}");
        if (!f["kind"].is_string() ||
            std::find(spec.choices.begin(), spec.choices.end(), f["kind"].get<std::string>()) == spec.choices.end())
          MOE_BAD_INPUT(where << ".kind = " << show_value(f["kind"]) << " (in " << origin << "): expected one of "
                              << quoted_list(spec.choices));
        if (!f["rank"].is_number_integer() || f["rank"].get<int64_t>() < 0)
          MOE_BAD_INPUT(where << ".rank = " << show_value(f["rank"]) << " (in " << origin
                              << "): expected an integer >= 0");
        if (!f["step"].is_number_integer() || f["step"].get<int64_t>() < 1)
          MOE_BAD_INPUT(where << ".step = " << show_value(f["step"]) << " (in " << origin
                              << "): expected an integer >= 1");
      }
      return value;
    }
  }
  MOE_FAIL("unhandled key type of " << spec.key);
}

std::string tables_markdown() {
  std::ostringstream out;
  for (const SectionSpec& section : sections()) {
    out << "## `" << section.name << "`\n\n" << section.doc << "\n\n";
    out << "| Key | Type | Default | Allowed | Meaning |\n|---|---|---|---|---|\n";
    for (const KeySpec& spec : schema()) {
      if (spec.key.compare(0, section.name.size() + 1, section.name + ".") != 0) continue;
      out << "| `" << spec.key << "` | " << type_name(spec) << " | `" << escape_cell(spec.default_value.dump())
          << "` | " << escape_cell(allowed_cell(spec)) << " | " << escape_cell(spec.doc) << " |\n";
    }
    out << "\n";
  }
  return out.str();
}

}  // namespace moe::config_schema
