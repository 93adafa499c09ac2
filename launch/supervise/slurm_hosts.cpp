// Slurm's compressed node lists and counts, expanded.
#include "launch/supervise/slurm_hosts.h"

#include <cctype>

#include "core/error.h"

namespace moe {

namespace {

// The top-level comma-separated items of `list` (commas inside brackets belong to a range).
std::vector<std::string> top_level_items(const std::string& list, const std::string& what) {
  std::vector<std::string> items;
  std::string item;
  int depth = 0;
  for (const char c : list) {
    if (c == '[') ++depth;
    if (c == ']' && --depth < 0) break;
    if (c == ',' && depth == 0) {
      items.push_back(item);
      item.clear();
    } else {
      item += c;
    }
  }
  if (depth != 0) MOE_BAD_INPUT(what << " = \"" << list << "\": unbalanced brackets");
  items.push_back(item);
  return items;
}

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (const char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

// One range inside brackets, "01-03" or "7", appended as suffixes with the width of its first bound.
void expand_range(const std::string& range, const std::string& prefix, const std::string& rest,
                  std::vector<std::string>* out, const std::string& what, const std::string& list) {
  const size_t dash = range.find('-');
  const std::string lo = range.substr(0, dash), hi = dash == std::string::npos ? lo : range.substr(dash + 1);
  if (!all_digits(lo) || !all_digits(hi) || std::stoll(hi) < std::stoll(lo) || std::stoll(hi) - std::stoll(lo) > 100000)
    MOE_BAD_INPUT(what << " = \"" << list << "\": \"" << range << "\" is not a range of node numbers");
  for (long long n = std::stoll(lo); n <= std::stoll(hi); ++n) {
    std::string number = std::to_string(n);
    if (number.size() < lo.size()) number = std::string(lo.size() - number.size(), '0') + number;
    for (const std::string& tail : expand_slurm_nodelist(rest.empty() ? "" : rest, what))
      out->push_back(prefix + number + tail);
  }
}

}  // namespace

std::vector<std::string> expand_slurm_nodelist(const std::string& list, const std::string& what) {
  if (list.empty()) return {""};
  std::vector<std::string> out;
  for (const std::string& item : top_level_items(list, what)) {
    const size_t open = item.find('[');
    if (item.empty()) MOE_BAD_INPUT(what << " = \"" << list << "\": an empty node name");
    if (open == std::string::npos) {
      out.push_back(item);
      continue;
    }
    const size_t close = item.find(']', open);
    const std::string prefix = item.substr(0, open), rest = item.substr(close + 1);
    for (const std::string& range : top_level_items(item.substr(open + 1, close - open - 1), what))
      expand_range(range, prefix, rest, &out, what, list);
  }
  return out;
}

std::vector<int64_t> expand_slurm_counts(const std::string& counts, const std::string& what) {
  std::vector<int64_t> out;
  for (const std::string& item : top_level_items(counts, what)) {
    const size_t paren = item.find('(');
    const std::string count = item.substr(0, paren);
    std::string times = "1";
    if (paren != std::string::npos) {
      if (item.size() < paren + 4 || item.compare(paren, 2, "(x") != 0 || item.back() != ')')
        MOE_BAD_INPUT(what << " = \"" << counts << "\": \"" << item << "\" is not COUNT or COUNT(xTIMES)");
      times = item.substr(paren + 2, item.size() - paren - 3);
    }
    if (!all_digits(count) || !all_digits(times) || std::stoll(count) < 1 || std::stoll(times) > 100000)
      MOE_BAD_INPUT(what << " = \"" << counts << "\": \"" << item << "\" is not COUNT or COUNT(xTIMES)");
    out.insert(out.end(), size_t(std::stoll(times)), std::stoll(count));
  }
  return out;
}

std::optional<std::vector<HostSlots>> slurm_hosts(const std::map<std::string, std::string>& env) {
  auto get = [&](const char* key) { return env.count(key) ? env.at(key) : std::string(); };
  std::string list_key = "SLURM_JOB_NODELIST";
  if (get("SLURM_JOB_NODELIST").empty()) list_key = "SLURM_NODELIST";
  const std::string list = get(list_key.c_str());
  if (list.empty()) return std::nullopt;
  const std::vector<std::string> nodes = expand_slurm_nodelist(list, list_key);
  std::string counts_key = "SLURM_TASKS_PER_NODE";
  if (get("SLURM_TASKS_PER_NODE").empty()) counts_key = "SLURM_JOB_CPUS_PER_NODE";
  const std::string counts = get(counts_key.c_str());
  std::vector<int64_t> slots(nodes.size(), 1);
  if (!counts.empty()) {
    slots = expand_slurm_counts(counts, counts_key);
    if (slots.size() != nodes.size())
      MOE_BAD_INPUT(counts_key << " = \"" << counts << "\" gives " << slots.size() << " counts for the " << nodes.size()
                               << " nodes of " << list_key << " = \"" << list << "\"");
  }
  std::vector<HostSlots> hosts;
  for (size_t i = 0; i < nodes.size(); ++i) hosts.push_back({nodes[i], slots[i]});
  return hosts;
}

}  // namespace moe
