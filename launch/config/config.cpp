// Loads the experiment config (launch/config/config.h): reads the JSON file, walks it and the --set overrides
// against the schema (launch/config/config_schema.h), fills defaults, then has the typed structs filled
// (launch/config/config_fill.cpp) and the rules between keys and the features this build does not have yet checked
// (launch/config/config_rules.cpp), and renders docs/config.md. It resolves nothing that needs the world size
// (parallel.dp = "auto" stays 0) and opens no data file: the trainer and data module do.
#include "launch/config/config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <sstream>

#include "core/error.h"
#include "launch/config/config_internal.h"
#include "launch/config/config_schema.h"

namespace moe {
namespace {

using json = nlohmann::json;
using config_detail::Checked;
using config_detail::Entries;
using config_detail::fill;
using config_detail::gates;
using config_detail::Rule;
using config_detail::rules;
using config_schema::KeySpec;

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

// "train.steps[0][0]...": a path into the document, shortened for messages.
std::string short_path(const std::string& path) {
  constexpr size_t kMaxChars = 60;
  if (path.empty()) return "the top level";
  return "'" + (path.size() > kMaxChars ? path.substr(0, kMaxChars) + "..." : path) + "'";
}

[[noreturn]] void too_deep(const std::string& origin, const std::string& where) {
  MOE_BAD_INPUT(origin << " nests objects and arrays more than " << kMaxConfigDepth << " levels deep (at "
                       << short_path(where) << "), the limit; a config needs at most 4: check the JSON");
}

[[noreturn]] void unknown_key(const std::string& key, const std::string& origin) {
  const std::string suggestion = config_schema::nearest_key(key);
  if (!suggestion.empty())
    MOE_BAD_INPUT("unknown key '" << key << "' in " << origin << "; did you mean '" << suggestion << "'?");
  // Nothing close: list what the innermost valid section does have.
  std::string section = key.substr(0, key.rfind('.') == std::string::npos ? 0 : key.rfind('.'));
  while (!section.empty() && !config_schema::is_section(section))
    section = section.substr(0, section.rfind('.') == std::string::npos ? 0 : section.rfind('.'));
  MOE_BAD_INPUT("unknown key '" << key << "' in " << origin << "; "
                                << (section.empty() ? "the sections are " : "the keys of '" + section + "' are ")
                                << join(config_schema::section_children(section)));
}

// Records every key of `object` (the contents of `section`, "" = the whole document) into `entries`.
void walk(const json& object, const std::string& section, const std::string& origin, Entries& entries) {
  for (const auto& [name, value] : object.items()) {
    const std::string key = section.empty() ? name : section + "." + name;
    if (name.empty() || name.find('.') != std::string::npos)
      MOE_BAD_INPUT("key '" << key << "' in " << origin
                            << ": names may not be empty or contain '.'; write nested objects, e.g. "
                               "{\"train\": {\"steps\": 5}}, or use --set for dotted keys");
    if (const KeySpec* spec = config_schema::find_key(key)) {
      entries[key] = {config_schema::check_value(*spec, value, origin), origin};
    } else if (config_schema::is_section(key)) {
      if (!value.is_object())
        MOE_BAD_INPUT("'" << key << "' = " << config_schema::show_value(value) << " (in " << origin
                          << ") is a section: expected an object with keys among "
                          << join(config_schema::section_children(key)));
      walk(value, key, origin, entries);
    } else {
      unknown_key(key, origin);
    }
  }
}

// VALUE of a --set as JSON (discarded when it does not parse), no deeper than a config file may nest.
json parse_set_value(const std::string& raw, const std::string& origin) {
  int64_t depth = 0;
  auto callback = [&](int, json::parse_event_t event, json&) {
    if (event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) {
      if (++depth > kMaxConfigDepth) too_deep(origin, "");
    } else if (event == json::parse_event_t::object_end || event == json::parse_event_t::array_end) {
      --depth;
    }
    return true;
  };
  return json::parse(raw, callback, /*allow_exceptions=*/false);
}

// "--set KEY=VALUE": VALUE is JSON when it parses, else the plain text. A string key always takes the
// text, so `--set checkpoint.dir=2024` is the folder "2024", not a type error.
void apply_override(const std::string& text, Entries& entries) {
  const size_t equals = text.find('=');
  if (equals == std::string::npos)
    MOE_BAD_INPUT("--set '" << text << "': expected KEY=VALUE, e.g. --set train.steps=5");
  const std::string key = text.substr(0, equals), raw = text.substr(equals + 1);
  check_utf8(text, "--set " + json(key).dump(-1, ' ', true, json::error_handler_t::replace));
  constexpr size_t kMaxShownChars = 100;  // a --set may be long; its message need not repeat all of it
  const std::string origin = "--set " + (text.size() > kMaxShownChars ? text.substr(0, kMaxShownChars) + "..." : text);
  const KeySpec* spec = config_schema::find_key(key);
  const bool takes_text =
      spec && (spec->type == config_schema::KeyType::String || spec->type == config_schema::KeyType::Choice);
  if (int64_t(raw.size()) > kMaxConfigBytes)
    MOE_BAD_INPUT("--set " << key << ": the value is " << raw.size() << " bytes, over the limit of " << kMaxConfigBytes
                           << " bytes (16 MiB); put large values in the config file");
  // A text key parses only a quoted VALUE: anything else is its text, however it is bracketed.
  json value = takes_text && raw.rfind('"', 0) != 0 ? json(raw) : parse_set_value(raw, origin);
  if (value.is_discarded() || (takes_text && !value.is_string())) value = raw;
  if (spec) {
    entries[key] = {config_schema::check_value(*spec, value, origin), origin};
  } else if (config_schema::is_section(key)) {
    if (!value.is_object())
      MOE_BAD_INPUT("'" << key << "' (in " << origin << ") is a section: expected a JSON object such as "
                        << "--set '" << key << "={\"" << config_schema::section_children(key)[0]
                        << "\": ...}', or set one key: --set " << key << "." << config_schema::section_children(key)[0]
                        << "=...");
    walk(value, key, origin, entries);
  } else {
    unknown_key(key.empty() ? "(empty)" : key, origin);
  }
}

const char* file_kind(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

[[noreturn]] void config_too_large(const std::string& path, int64_t bytes) {
  MOE_BAD_INPUT("config file '" << path << "' is " << bytes << " bytes, over the limit of " << kMaxConfigBytes
                                << " bytes (16 MiB); a config is a few kilobytes: check that --config names the "
                                   "experiment's JSON file");
}

// Reads at most kMaxConfigBytes of a regular file. The file is opened without blocking and judged by
// fstat of what was opened, so a FIFO, /dev/zero or a huge file is refused before any of it is read.
std::string read_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) MOE_BAD_INPUT("config file '" << path << "' does not exist");
    MOE_BAD_INPUT("cannot open config file '" << path << "': " << std::strerror(errno)
                                              << "; check the path and its permissions");
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) MOE_BAD_INPUT("cannot read config file '" << path << "': " << std::strerror(errno));
  if (S_ISDIR(st.st_mode)) MOE_BAD_INPUT("config file '" << path << "' is a directory; expected a JSON file");
  if (!S_ISREG(st.st_mode))
    MOE_BAD_INPUT("config file '" << path << "' is " << file_kind(st.st_mode)
                                  << "; expected a regular JSON file: write the config to a file and pass its path");
  if (st.st_size > kMaxConfigBytes) config_too_large(path, int64_t(st.st_size));
  std::string text;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) MOE_BAD_INPUT("cannot read config file '" << path << "': " << std::strerror(errno));
    if (n == 0) break;
    text.append(buffer, size_t(n));
    if (int64_t(text.size()) > kMaxConfigBytes) config_too_large(path, int64_t(text.size()));  // it grew
  }
  return text;
}

// nlohmann reports a byte offset; people read lines and columns, and the line itself.
[[noreturn]] void malformed_json(const std::string& path, const std::string& text, const json::parse_error& e) {
  // e.byte counts from 1 and points at the last character read, the one that broke the parse.
  const size_t offset = std::min<size_t>(e.byte == 0 ? 0 : e.byte - 1, text.size());
  const size_t previous_newline = offset == 0 ? std::string::npos : text.rfind('\n', offset - 1);
  const size_t begin = previous_newline == std::string::npos ? 0 : previous_newline + 1;
  const int64_t line = 1 + std::count(text.begin(), text.begin() + int64_t(begin), '\n');
  const int64_t column = int64_t(offset - begin) + 1;
  std::string detail = e.what();
  // Keep nlohmann's explanation ("syntax error while parsing ...") without its own position prefix.
  if (const size_t at = detail.find(": syntax error"); at != std::string::npos) detail = detail.substr(at + 2);
  std::string source_line = text.substr(begin, text.find('\n', begin) - begin);
  if (source_line.size() > 120) source_line = source_line.substr(0, 120) + "...";
  MOE_BAD_INPUT("malformed JSON in " << path << " at line " << line << ", column " << column << ": " << detail << "\n  "
                                     << source_line);
}

// JSON keeps only the last of two equal keys; in a config that silently drops a setting.
json parse_rejecting_duplicates(const std::string& path, const std::string& text) {
  struct Frame {
    std::string path;
    bool is_array = false;
    int64_t next_index = 0;
    std::string last_key;
    std::set<std::string> keys;
  };
  std::vector<Frame> stack;
  auto child_path = [&stack]() -> std::string {
    if (stack.empty()) return "";
    Frame& top = stack.back();
    if (top.is_array) return top.path + "[" + std::to_string(top.next_index++) + "]";
    return top.path.empty() ? top.last_key : top.path + "." + top.last_key;
  };
  auto callback = [&](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start: {
        Frame frame;
        frame.path = child_path();
        if (int64_t(stack.size()) >= kMaxConfigDepth) too_deep("config file '" + path + "'", frame.path);
        frame.is_array = event == json::parse_event_t::array_start;
        stack.push_back(std::move(frame));
        break;
      }
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        stack.pop_back();
        break;
      case json::parse_event_t::key: {
        Frame& top = stack.back();
        top.last_key = parsed.get<std::string>();
        if (!top.keys.insert(top.last_key).second)
          MOE_BAD_INPUT("duplicate key '" << (top.path.empty() ? "" : top.path + ".") << top.last_key << "' in " << path
                                          << ": JSON keeps only the last value; remove one of them");
        break;
      }
      case json::parse_event_t::value:
        if (!stack.empty() && stack.back().is_array) ++stack.back().next_index;
        break;
    }
    return true;
  };
  try {
    return json::parse(text, callback);
  } catch (const json::parse_error& e) {
    malformed_json(path, text, e);
  }
}

}  // namespace

bool is_valid_utf8(const std::string& text) {
  try {
    (void)json(text).dump();  // the library's own check, the one that would fail when the run records it
    return true;
  } catch (const json::type_error&) {
    return false;
  }
}

void check_utf8(const std::string& text, const std::string& label) {
  if (!is_valid_utf8(text))
    MOE_BAD_INPUT(label << " is not valid UTF-8 (" << json(text).dump(-1, ' ', true, json::error_handler_t::replace)
                        << "); the run records it as JSON text: use UTF-8 names");
}

double RouterConfig::tau_at(int64_t step) const {
  if (tau_schedule.empty()) return tau;
  if (step <= tau_schedule.front().step) return tau_schedule.front().tau;
  for (size_t i = 1; i < tau_schedule.size(); ++i) {
    const TauPoint &a = tau_schedule[i - 1], &b = tau_schedule[i];
    if (step <= b.step) return a.tau + (b.tau - a.tau) * double(step - a.step) / double(b.step - a.step);
  }
  return tau_schedule.back().tau;
}

bool MoeConfig::overflow_has(Overflow level) const {
  return std::find(overflow.begin(), overflow.end(), level) != overflow.end();
}

Overflow MoeConfig::overflow_policy() const {
  if (overflow_has(Overflow::Reroute))
    return overflow_has(Overflow::Dense) ? Overflow::RerouteDense : Overflow::Reroute;
  return overflow_has(Overflow::Dense) ? Overflow::Dense : Overflow::Drop;
}

Config config_from_json(const json& document, const std::vector<std::string>& overrides, const std::string& origin) {
  if (!document.is_object())
    MOE_BAD_INPUT("config " << origin << " = " << config_schema::show_value(document)
                            << ": expected a JSON object with sections among "
                            << join(config_schema::section_children("")));
  Entries entries;
  walk(document, "", origin, entries);
  for (const std::string& text : overrides) apply_override(text, entries);
  for (const KeySpec& spec : config_schema::schema())
    if (!entries.count(spec.key))
      entries[spec.key] = {config_schema::check_value(spec, spec.default_value, "default"), "default"};
  Config config = fill(entries);
  const Checked checked{config, entries};
  for (const Rule& rule : rules())
    if (rule.check) rule.check(checked);
  for (const Rule& gate : gates()) gate.check(checked);
  return config;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  return config_from_json(parse_rejecting_duplicates(path, read_file(path)), overrides, path);
}

std::string config_reference_markdown() {
  std::ostringstream out;
  out << R"(# Config reference

<!-- Generated by moe::config_reference_markdown() from the schema in launch/config/config_schema.cpp and the
     rules in launch/config/config_rules.cpp; do not edit by hand. Regenerate with
     MOE_REGENERATE_DOCS=1 build/bin/test_config --gtest_filter='ConfigDocs.*' -->

An experiment is one JSON file of nested objects, one per section below. Every key is optional and takes
its default when absent; the defaults are a small dense model that trains on a CPU. For example:

```json
{
  "train": {"steps": 1000, "global_batch": 32},
  "model": {"d_model": 256, "layers": 6},
  "data": {"sources": [{"name": "code", "path": "data/code.txt", "weight": 2}]}
}
```

The resolved config, every key with its value, is written to the run directory as `config.json`.

Everything a run computes is chosen here. A choice (a key whose values are names, such as `train.device` or
`moe.router.noise`) is read once, when the config is loaded, into the value the program compares
(launch/config/config_choices.h spells each name once: the allowed values below, and the text of every message
and file that shows the value). The environment holds no configuration: the variables the program reads (the
machine's, the launchers' and developers' switches) are listed, with who sets them, in docs/cli.md "Environment
variables".

## Overriding keys: `--set`

`moe train --config FILE --set KEY=VALUE ...` replaces one key after the file is read; a later `--set`
wins over an earlier one. KEY is a dotted key of the tables below. VALUE is read as JSON when it parses,
so `--set train.steps=5` is the integer 5 and `--set 'data.sources=[{"name": "a", "path": "a.txt"}]'`
is a list; otherwise it is the text itself (`--set moe.router.noise=gumbel`, `--set parallel.dp=auto`).
A string-valued key always takes the text (`--set checkpoint.dir=2024` is the folder "2024"). KEY may
also be a section with a JSON object as VALUE: `--set 'moe.router={"tau": 0.5}'`.

## Validation

The whole config is checked when it is loaded, before any work starts. The first problem stops the
program with exit code 2 and a message naming the key, its value, where the value came from (the file
or the `--set`) and what is expected.

- Types are strict: an `integer` must be a JSON integer (`3.0` and `"3"` are errors); a `number`
  accepts integers too.
- Values must be in range, and strings one of the allowed values. Every `number` must also be one that
  float32 holds (0, or a magnitude in [1.2e-38, 3.4e38]): the model computes in single precision, so
  `moe.router.tau = 1e308` would become infinity and `1e-50` zero; both are refused by name.
- Text (a `--set` value, a path, a source name) must be valid UTF-8: the run records it as JSON.
- Unknown keys are errors at every level, and the nearest valid key is suggested; a section must be an
  object. A key may appear only once in a file.
- Malformed JSON is reported with its line and column.
- What is parsed is bounded: the config must be a regular file (not a FIFO, a device or a directory) of
  at most 16 MiB, with objects and arrays nested at most 64 deep; a `--set` value has the same bounds.
- The limits of the code itself (e.g. at most 1024 experts, step numbers of at most 8 digits) are the
  ranges of the tables below, so a value past one is refused here, by name, not when training starts.

The values must also agree with each other:

)";
  for (const Rule& rule : rules()) out << "- " << rule.doc << "\n";
  if (!gates().empty())
    out << "\nThese features are not available in this build yet, so their keys must keep these values (checked "
           "after the rules above, so a config learns first what could never work):\n\n";
  for (const Rule& gate : gates()) out << "- " << gate.doc << "\n";
  out << "\n" << config_schema::tables_markdown();
  std::string text = out.str();
  while (text.size() >= 2 && text[text.size() - 1] == '\n' && text[text.size() - 2] == '\n') text.pop_back();
  return text;
}

}  // namespace moe
