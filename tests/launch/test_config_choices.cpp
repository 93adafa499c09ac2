// The config's choice-valued keys parsed once into enums (launch/config/config_choices.h): every allowed value of
// every choice key arrives as its enum and prints back as the same text, the resolved config echoes it unchanged,
// the schema's allowed values are the enums' names, and a value outside them (or of another type) is refused as bad
// input naming the key, the value and what is expected.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "config_test_util.h"
#include "launch/config/config.h"
#include "launch/config/config_schema.h"

namespace moe {
namespace {

using json = nlohmann::json;
using config_test::document_with;
using config_test::expect_bad_input;
using config_test::from;

// A choice key's typed field, printed as to_string prints it.
using Printed = std::function<std::string(const Config&)>;

const std::map<std::string, Printed>& printed_fields() {
  static const std::map<std::string, Printed> fields = {
      {"train.device", [](const Config& c) { return to_string(c.train.device); }},
      {"train.precision", [](const Config& c) { return to_string(c.train.precision); }},
      {"train.recompute", [](const Config& c) { return to_string(c.train.recompute); }},
      {"train.fused_attention", [](const Config& c) { return to_string(c.train.fused_attention); }},
      {"model.attention", [](const Config& c) { return to_string(c.model.attention); }},
      {"moe.router.noise", [](const Config& c) { return to_string(c.moe.router.noise); }},
      {"moe.router.score", [](const Config& c) { return to_string(c.moe.router.score); }},
      {"moe.router.bias_balance.rule", [](const Config& c) { return to_string(c.moe.router.bias_balance_rule); }},
      {"moe.drop_policy", [](const Config& c) { return to_string(c.moe.drop_policy); }},
      {"moe.dispatcher", [](const Config& c) { return to_string(c.moe.dispatcher); }},
      {"parallel.pp_schedule", [](const Config& c) { return to_string(c.parallel.pp_schedule); }},
  };
  return fields;
}

// What a choice needs beside it to pass the rules between keys (interleaved stages need stages and chunks).
std::vector<std::string> companions(const std::string& key, const std::string& value) {
  if (key == "parallel.pp_schedule" && value == "interleaved_1f1b")
    return {"parallel.pp=2", "parallel.vpp=2", "model.layers=4"};
  return {};
}

std::vector<const config_schema::KeySpec*> keys_of(config_schema::KeyType type) {
  std::vector<const config_schema::KeySpec*> out;
  for (const config_schema::KeySpec& spec : config_schema::schema())
    if (spec.type == type) out.push_back(&spec);
  return out;
}

json::json_pointer pointer_of(std::string key) {
  std::replace(key.begin(), key.end(), '.', '/');
  return json::json_pointer("/" + key);
}

std::vector<std::string> names_of(const std::vector<Overflow>& levels) {
  std::vector<std::string> out;
  for (Overflow level : levels) out.push_back(to_string(level));
  return out;
}

TEST(ConfigChoices, EveryChoiceKeyIsHeldAsAnEnum) {
  std::set<std::string> choice_keys;
  for (const config_schema::KeySpec* spec : keys_of(config_schema::KeyType::Choice)) choice_keys.insert(spec->key);
  std::set<std::string> tested;
  for (const auto& [key, printed] : printed_fields()) tested.insert(key);
  EXPECT_EQ(choice_keys, tested) << "a choice key without its enum here (or an enum of a key that is no choice)";
}

TEST(ConfigChoices, EveryValueRoundTripsThroughItsEnum) {
  for (const config_schema::KeySpec* spec : keys_of(config_schema::KeyType::Choice)) {
    ASSERT_TRUE(printed_fields().count(spec->key)) << spec->key;
    const Printed& printed = printed_fields().at(spec->key);
    EXPECT_EQ(printed(from(json::object())), spec->default_value.get<std::string>()) << spec->key << ": the default";
    for (const std::string& value : spec->choices) {
      SCOPED_TRACE(spec->key + " = " + value);
      const Config c = from(document_with(spec->key, value), companions(spec->key, value));
      EXPECT_EQ(printed(c), value);
      EXPECT_EQ(c.resolved[pointer_of(spec->key)], value) << "the resolved config echoes it";
      // --set takes the bare text, as a user types it.
      EXPECT_EQ(printed(from(json::object(),
                             [&] {
                               std::vector<std::string> set = companions(spec->key, value);
                               set.push_back(spec->key + "=" + value);
                               return set;
                             }())),
                value);
    }
  }
}

TEST(ConfigChoices, DistinctNamesForDistinctValues) {
  for (const config_schema::KeySpec* spec : keys_of(config_schema::KeyType::Choice)) {
    std::set<std::string> printed;
    for (const std::string& value : spec->choices)
      printed.insert(
          printed_fields().at(spec->key)(from(document_with(spec->key, value), companions(spec->key, value))));
    EXPECT_EQ(printed.size(), spec->choices.size()) << spec->key << ": two names parse to one value";
  }
}

TEST(ConfigChoices, NamesAndValuesConvertBothWays) {
  EXPECT_EQ(to_string(Device::Cuda), "cuda");
  EXPECT_EQ(choice_from_string<Device>("cpu"), Device::Cpu);
  EXPECT_EQ(to_string(GemmPrecision::Bf16), "bf16");
  EXPECT_EQ(choice_from_string<Recompute>("selective"), Recompute::Selective);
  EXPECT_EQ(to_string(PpSchedule::Interleaved1F1B), "interleaved_1f1b");
  EXPECT_EQ(choice_from_string<FaultKind>("corrupt_checkpoint"), FaultKind::CorruptCheckpoint);
  EXPECT_EQ(choice_names<RouterNoise>(), (std::vector<std::string>{"gumbel", "none"})) << "docs/config.md's order";
  // Only the program can ask for a name that is not in a table (the schema refuses the user's): a program error.
  try {
    choice_from_string<Device>("tpu");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Internal);
  }
  try {
    to_string(Overflow::RerouteDense);  // a cascade, not a level: it has no one name
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Internal);
  }
}

TEST(ConfigChoices, OverflowLevelsRoundTripAsTheCascade) {
  struct Case {
    json value;
    std::vector<std::string> levels;
    Overflow policy;
  };
  for (const Case& c : std::vector<Case>{{"drop", {"drop"}, Overflow::Drop},
                                         {"reroute", {"reroute"}, Overflow::Reroute},
                                         {"dense", {"dense"}, Overflow::Dense},
                                         {{"dense"}, {"dense"}, Overflow::Dense},
                                         {{"reroute", "dense"}, {"reroute", "dense"}, Overflow::RerouteDense},
                                         {{"reroute", "drop"}, {"reroute", "drop"}, Overflow::Reroute}}) {
    SCOPED_TRACE(c.value.dump());
    const Config config = from(document_with("moe.overflow", c.value));
    EXPECT_EQ(names_of(config.moe.overflow), c.levels);
    EXPECT_EQ(config.moe.overflow_policy(), c.policy);
    EXPECT_EQ(config.resolved["moe"]["overflow"], c.value) << "the resolved config echoes what was written";
  }
  expect_bad_input(
      [] {
        from(document_with("moe.overflow", json{"dense", "reroute"}));
      },
      {"moe.overflow", "[\"dense\",\"reroute\"]", "reroutes first"});
  expect_bad_input(
      [] {
        from(document_with("moe.overflow", json{"reroute", "spill"}));
      },
      {"moe.overflow", "\"drop\", \"reroute\", \"dense\""});
}

TEST(ConfigChoices, FaultKindsRoundTrip) {
  for (const std::string& kind : choice_names<FaultKind>()) {
    SCOPED_TRACE(kind);
    const json inject = json::array({{{"kind", kind}, {"rank", 1}, {"step", 3}}});
    const bool alltoall = kind == "freeze_alltoall" || kind == "mismatch_alltoall";
    const Config c = from(document_with("fault.inject", inject),
                          alltoall ? std::vector<std::string>{"parallel.ep=2"} : std::vector<std::string>{});
    ASSERT_EQ(c.fault.inject.size(), 1u);
    EXPECT_EQ(to_string(c.fault.inject[0].kind), kind);
    EXPECT_EQ(c.resolved["fault"]["inject"][0]["kind"], kind);
  }
  expect_bad_input(
      [] {
        from(document_with("fault.inject", json::array({{{"kind", "explode"}, {"rank", 0}, {"step", 1}}})));
      },
      {"fault.inject", "\"explode\"", "\"kill\", \"hang\", \"stop\""});
  expect_bad_input(
      [] {
        from(document_with("fault.inject", json::array({{{"kind", "freeze_alltoall"}, {"rank", 0}, {"step", 1}}})));
      },
      {"fault.inject", "\"freeze_alltoall\"", "parallel.ep"});
}

// Every choice key refuses a name outside its table and a value of another type, naming the key, the value and
// the allowed names (which the user's message lists in the table's order).
TEST(ConfigChoices, ValuesOutsideTheTableAreRefusedByKey) {
  for (const config_schema::KeySpec* spec : keys_of(config_schema::KeyType::Choice)) {
    SCOPED_TRACE(spec->key);
    std::string allowed;
    for (const std::string& name : spec->choices) allowed += (allowed.empty() ? "\"" : ", \"") + name + "\"";
    expect_bad_input([&] { from(document_with(spec->key, "bogus")); }, {spec->key, "\"bogus\"", allowed});
    expect_bad_input([&] { from(document_with(spec->key, 1)); }, {spec->key, "1", allowed});
    expect_bad_input([&] { from(json::object(), {spec->key + "=" + spec->choices[0] + "x"}); },
                     {spec->key, spec->choices[0] + "x", allowed});
    // Names are exact: another case is another name.
    std::string upper = spec->choices[0];
    for (char& ch : upper) ch = char(std::toupper(static_cast<unsigned char>(ch)));
    expect_bad_input([&] { from(document_with(spec->key, upper)); }, {spec->key, upper, allowed});
  }
}

}  // namespace
}  // namespace moe
