// Metrics lines as TensorBoard events.
#include "launch/run/tensorboard.h"

#include <chrono>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "launch/run/run_files.h"

namespace moe {
namespace fs = std::filesystem;

namespace {

constexpr const char* kPrefix = "events.out.tfevents.";
constexpr size_t kTimeDigits = 10;

fs::path tensorboard_dir(const fs::path& run_dir) { return run_dir / "tensorboard"; }

void add_scalar(tensorboard::Summary& summary, const std::string& tag, double value) {
  tensorboard::Summary::Value* v = summary.add_value();
  v->set_tag(tag);
  v->set_simple_value(float(value));
}

// Bucket e, [e, e + 1), holds expert e's assignments: TensorBoard draws the layer's load over expert index.
void add_load_histogram(tensorboard::Summary& summary, const std::string& tag, const nlohmann::json& counts) {
  tensorboard::HistogramProto* h = summary.add_value()->mutable_histo();
  summary.mutable_value(summary.value_size() - 1)->set_tag(tag);
  double num = 0, sum = 0, sum_squares = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    const double c = counts[e].get<double>(), x = double(e);
    num += c;
    sum += c * x;
    sum_squares += c * x * x;
    h->add_bucket_limit(x + 1);
    h->add_bucket(c);
  }
  h->set_min(0);
  h->set_max(double(counts.size()));
  h->set_num(num);
  h->set_sum(sum);
  h->set_sum_squares(sum_squares);
}

// Every number under `value`, tagged `tag` and below it by key.
void add_numbers(tensorboard::Summary& summary, const std::string& tag, const nlohmann::json& value) {
  if (value.is_number()) add_scalar(summary, tag, value.get<double>());
  if (value.is_object())
    for (const auto& [key, inner] : value.items()) add_numbers(summary, tag + "/" + key, inner);
}

// An MoE layer's fields: moe/FIELD/layer_L, grouped by field so that one chart section compares the layers.
void add_moe_layer(tensorboard::Summary& summary, size_t layer, const nlohmann::json& fields) {
  const std::string suffix = "/layer_" + std::to_string(layer);
  for (const auto& [key, value] : fields.items()) {
    if (key == "tokens_per_expert" && value.is_array() && !value.empty())
      add_load_histogram(summary, "moe/tokens_per_expert" + suffix, value);
    else if (value.is_number())
      add_scalar(summary, "moe/" + key + suffix, value.get<double>());
  }
}

// The 10-digit time field of one of our file names, -1 for any other name.
int64_t name_time(const std::string& name) {
  if (name.rfind(kPrefix, 0) != 0 || name.size() < std::strlen(kPrefix) + kTimeDigits) return -1;
  const std::string digits = name.substr(std::strlen(kPrefix), kTimeDigits);
  if (digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

std::vector<fs::path> events_files(const fs::path& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec))
    if (name_time(entry.path().filename().string()) >= 0 && entry.is_regular_file(ec)) files.push_back(entry.path());
  return files;
}

// TensorBoard reads a directory's files in name order: the time field never goes back (the clock may) and the
// start's number after it breaks ties, so the name order is the order of the starts.
fs::path new_events_path(const fs::path& dir) {
  int64_t time =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::vector<fs::path> existing = events_files(dir);
  for (const fs::path& p : existing) time = std::max(time, name_time(p.filename().string()));
  char name[96];
  std::snprintf(name, sizeof name, "%s%010lld.moe.%06zu", kPrefix, static_cast<long long>(time), existing.size() + 1);
  return dir / name;
}

double wall_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

tensorboard::Summary line_summary(const nlohmann::json& line) {
  tensorboard::Summary summary;
  for (const auto& [key, value] : line.items()) {
    if (key == "step" || key == "alerts") continue;
    if (key == "moe" && value.is_array()) {
      for (size_t l = 0; l < value.size(); ++l) add_moe_layer(summary, l, value[l]);
    } else {
      // Losses of every kind and source share one section; the rest is grouped by its field.
      const bool loss = key.find("loss") != std::string::npos;
      add_numbers(summary, loss ? "loss/" + key : value.is_object() ? key : "train/" + key, value);
    }
  }
  return summary;
}

void check_tensorboard_dir(const fs::path& run_dir) {
  const Entry e = entry_kind(tensorboard_dir(run_dir));
  if (e != Entry::Missing && e != Entry::Directory)
    make_real_dir(tensorboard_dir(run_dir), "TensorBoard's event files");  // refuses, naming it
}

void clear_tensorboard(const fs::path& run_dir) {
  if (entry_kind(tensorboard_dir(run_dir)) != Entry::Directory) return;
  for (const fs::path& file : events_files(tensorboard_dir(run_dir))) {
    std::error_code ec;
    fs::remove(file, ec);
    if (ec) MOE_RUN_FAILED("cannot remove " << file.string() << ": " << ec.message());
  }
}

TensorBoardWriter::TensorBoardWriter(const fs::path& run_dir, int64_t start_step) {
  const fs::path dir = tensorboard_dir(run_dir);
  make_real_dir(dir, "TensorBoard's event files");
  file_ = std::make_unique<EventFile>(new_events_path(dir));
  tensorboard::Event version;
  version.set_wall_time(wall_time_now());
  version.set_file_version("brain.Event:2");
  file_->write(version);
  // TensorBoard drops every event it has read at this step or later: what a crashed start wrote past the
  // checkpoint this start resumes from.
  tensorboard::Event start;
  start.set_wall_time(wall_time_now());
  start.set_step(start_step + 1);
  start.mutable_session_log()->set_status(tensorboard::SessionLog::START);
  file_->write(start);
}

void TensorBoardWriter::write(const nlohmann::json& line) {
  tensorboard::Event event;
  event.set_wall_time(wall_time_now());
  event.set_step(line.at("step").get<int64_t>());
  *event.mutable_summary() = line_summary(line);
  file_->write(event);
}

}  // namespace moe
