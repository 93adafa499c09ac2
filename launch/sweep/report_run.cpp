// A run's page (launch/sweep/report_run.h): the fields of each metrics line folded into bounded curves as it is read.
#include "launch/sweep/report_run.h"

#include <cmath>
#include <optional>
#include <vector>

#include "launch/sweep/report_page.h"
#include "launch/sweep/report_sampling.h"

namespace moe::report {
using json = nlohmann::json;

namespace {

// A number field of an object: nullopt when absent or null (a non-finite value is written as null); a value of
// another type is counted as odd.
std::optional<double> number(const json& object, const char* key, Skipped& skipped) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) {
    ++skipped.odd_fields;
    return std::nullopt;
  }
  const double v = it->get<double>();
  return std::isfinite(v) ? std::optional<double>(v) : std::nullopt;
}

void add_to(SeriesSampler& s, double step, std::optional<double> v) {
  if (v) s.add(step, *v);
}

struct LayerCurves {
  SeriesSampler entropy{kMaxPoints}, cv{kMaxPoints}, overflow{kMaxPoints}, max_over_mean{kMaxPoints},
      stability{kMaxPoints};
  ColumnMeans load{kMaxColumns, kMaxHeatmapCells};
};

// Assignments of all layers of one line: what the drop, reroute and fallback shares are shares of.
struct Assignments {
  double processed = 0, dropped = 0, rerouted = 0, fallback = 0;
};

class RunPage {
 public:
  explicit RunPage(Skipped& skipped) : skipped_(skipped) {}
  void add(const json& line);
  std::string html(const std::string& title, const json& manifest) const;

 private:
  void add_train(double step, const json& line);
  void add_layer(size_t l, double step, const json& layer, Assignments& all);
  void add_alerts(double step, const json& alerts);
  void add_eval(double step, const json& line);
  void add_routing(Page& page) const;
  std::string subtitle(const json& manifest) const;

  Skipped& skipped_;
  SeriesSampler loss_{kMaxPoints}, lm_loss_{kMaxPoints}, lr_{kMaxPoints}, grad_norm_{kMaxPoints},
      tokens_per_s_{kMaxPoints}, dead_{kMaxPoints}, dropped_{kMaxPoints}, rerouted_{kMaxPoints}, fallback_{kMaxPoints},
      eval_{kMaxPoints};
  std::vector<std::pair<std::string, SeriesSampler>> sources_;
  uint64_t sources_not_drawn_ = 0, alerts_ = 0, train_lines_ = 0, eval_lines_ = 0;
  std::vector<LayerCurves> layers_;
  size_t layers_seen_ = 0;
  std::string alert_rows_;
  std::optional<double> last_step_;
};

void RunPage::add(const json& line) {
  const auto step = line.is_object() ? line.find("step") : json::const_iterator();
  if (!line.is_object() || step == line.end() || !step->is_number() || !std::isfinite(step->get<double>())) {
    ++skipped_.odd_lines;
    return;
  }
  const double x = step->get<double>();
  if (line.contains("lm_loss") && line.contains("moe")) add_train(x, line);
  if (line.contains("eval_loss")) add_eval(x, line);
}

void RunPage::add_train(double step, const json& line) {
  ++train_lines_;
  last_step_ = step;
  add_to(loss_, step, number(line, "loss", skipped_));
  add_to(lm_loss_, step, number(line, "lm_loss", skipped_));
  add_to(lr_, step, number(line, "lr", skipped_));
  add_to(grad_norm_, step, number(line, "grad_norm", skipped_));
  add_to(tokens_per_s_, step, number(line, "tokens_per_s", skipped_));
  add_to(dead_, step, number(line, "dead_experts", skipped_));
  const json& moe = line["moe"];
  if (!moe.is_array()) {
    ++skipped_.odd_fields;
  } else {
    Assignments all;
    for (size_t l = 0; l < moe.size(); ++l) add_layer(l, step, moe[l], all);
    const double total = all.processed + all.dropped + all.fallback;
    if (total > 0) {
      dropped_.add(step, all.dropped / total);
      rerouted_.add(step, all.rerouted / total);
      fallback_.add(step, all.fallback / total);
    }
  }
  if (line.contains("alerts")) add_alerts(step, line["alerts"]);
}

// Each expert's share of the layer's assignments: nullopt (counted) when tokens_per_expert is not an array of
// numbers.
std::optional<std::vector<double>> expert_counts(const json& layer, Skipped& skipped) {
  const auto it = layer.find("tokens_per_expert");
  if (it == layer.end()) return std::nullopt;
  std::vector<double> counts;
  if (it->is_array())
    for (const json& c : *it) {
      if (!c.is_number() || !std::isfinite(c.get<double>()) || counts.size() == kMaxExpertsDrawn) break;
      counts.push_back(c.get<double>());
    }
  if (!it->is_array() || counts.size() != it->size()) {
    ++skipped.odd_fields;
    return std::nullopt;
  }
  return counts;
}

void RunPage::add_layer(size_t l, double step, const json& layer, Assignments& all) {
  if (!layer.is_object()) {
    ++skipped_.odd_fields;
    return;
  }
  const std::optional<std::vector<double>> counts = expert_counts(layer, skipped_);
  if (counts)
    for (const double c : *counts) all.processed += c;
  all.dropped += number(layer, "dropped", skipped_).value_or(0.0);
  all.rerouted += number(layer, "rerouted", skipped_).value_or(0.0);
  all.fallback += number(layer, "fallback", skipped_).value_or(0.0);
  layers_seen_ = std::max(layers_seen_, l + 1);
  if (l >= kMaxLayersDrawn) return;
  if (layers_.size() <= l) layers_.resize(l + 1);
  LayerCurves& c = layers_[l];
  add_to(c.entropy, step, number(layer, "entropy", skipped_));
  add_to(c.cv, step, number(layer, "cv", skipped_));
  add_to(c.overflow, step, number(layer, "overflow_ratio", skipped_));
  add_to(c.max_over_mean, step, number(layer, "load_max_over_mean", skipped_));
  add_to(c.stability, step, number(layer, "stability", skipped_));
  if (!counts) return;
  double total = 0;
  for (const double v : *counts) total += v;
  std::vector<double> share;
  for (const double v : *counts) share.push_back(total > 0 ? v / total : 0.0);
  c.load.add(step, share);
}

std::string integer_text(const std::optional<double>& v) {
  return v ? std::to_string(int64_t(std::llround(std::clamp(*v, -9e18, 9e18)))) : "";
}

void RunPage::add_alerts(double step, const json& alerts) {
  if (!alerts.is_array()) {
    ++skipped_.odd_fields;
    return;
  }
  for (const json& a : alerts) {
    if (!a.is_object()) {
      ++skipped_.odd_fields;
      continue;
    }
    if (++alerts_ > kMaxAlertRows) continue;
    const auto kind = a.find("kind");
    std::string kind_text;
    if (kind != a.end() && kind->is_string())
      kind_text = kind->get<std::string>();
    else if (kind != a.end())
      ++skipped_.odd_fields;
    alert_rows_ += "<tr><td>" + integer_text(step) + "</td><td class=\"l\">" + escape(kind_text) + "</td><td>" +
                   integer_text(number(a, "layer", skipped_)) + "</td><td>" +
                   integer_text(number(a, "expert", skipped_)) + "</td><td>" +
                   format_number(number(a, "value", skipped_).value_or(NAN)) + "</td><td>" +
                   format_number(number(a, "threshold", skipped_).value_or(NAN)) + "</td><td>" +
                   integer_text(number(a, "since_step", skipped_)) + "</td></tr>";
  }
}

void RunPage::add_eval(double step, const json& line) {
  ++eval_lines_;
  add_to(eval_, step, number(line, "eval_loss", skipped_));
  const auto by_source = line.find("eval_loss_by_source");
  if (by_source == line.end()) return;
  if (!by_source->is_object()) {
    ++skipped_.odd_fields;
    return;
  }
  for (const auto& [name, value] : by_source->items()) {
    const std::optional<double> v = number(*by_source, name.c_str(), skipped_);
    auto it = std::find_if(sources_.begin(), sources_.end(), [&](const auto& s) { return s.first == name; });
    if (it == sources_.end() && sources_.size() == kMaxSourcesDrawn) {
      ++sources_not_drawn_;
      continue;
    }
    if (it == sources_.end()) it = sources_.insert(sources_.end(), {name, SeriesSampler(kMaxPoints)});
    add_to(it->second, step, v);
  }
}

// The load heatmap of one layer: rows experts, columns steps.
Heatmap load_heatmap(size_t l, const ColumnMeans& load) {
  Heatmap m;
  m.id = "heatmap-load-layer-" + std::to_string(l);
  m.title = "Expert load, layer " + std::to_string(l) + " (share of assignments)";
  m.x_label = "step", m.y_label = "expert";
  const std::vector<ColumnMeans::Column> cols = load.columns();
  m.values.assign(load.rows(), std::vector<std::optional<double>>(cols.size()));
  for (size_t e = 0; e < load.rows(); ++e) m.row_labels.push_back(std::to_string(e));
  for (size_t c = 0; c < cols.size(); ++c) {
    m.col_labels.push_back(integer_text(cols[c].last_step));
    for (size_t e = 0; e < load.rows(); ++e) m.values[e][c] = cols[c].sum[e];
  }
  return m;
}

template <typename Field>
std::vector<Series> per_layer(const std::vector<LayerCurves>& layers, Field field) {
  std::vector<Series> out;
  for (size_t l = 0; l < layers.size(); ++l) out.push_back((layers[l].*field).series("layer " + std::to_string(l)));
  return out;
}

void RunPage::add_routing(Page& page) const {
  if (layers_.empty()) return;
  page.section("Routing");
  for (size_t l = 0; l < layers_.size(); ++l)
    if (layers_[l].load.rows() > 0) page.add(load_heatmap(l, layers_[l].load));
  std::vector<Series> drops = {dropped_.series("dropped share"), rerouted_.series("rerouted share"),
                               fallback_.series("fallback share")};
  for (Series& s : per_layer(layers_, &LayerCurves::overflow)) drops.push_back({"overflow " + s.name, s.x, s.y});
  page.add(LineChart{"chart-overflow", "Drops, reroutes and overflow (share of assignments)", "step", "share", drops});
  page.add(LineChart{"chart-entropy", "Routing entropy (mean per token, nats)", "step", "entropy",
                     per_layer(layers_, &LayerCurves::entropy)});
  page.add(LineChart{"chart-cv", "Load cv (std / mean of tokens per expert)", "step", "cv",
                     per_layer(layers_, &LayerCurves::cv)});
  page.add(LineChart{"chart-max-over-mean", "Load max / mean", "step", "max / mean",
                     per_layer(layers_, &LayerCurves::max_over_mean)});
  page.add(LineChart{"chart-stability", "Routing stability (probe tokens with the same top-1 as the last logged step)",
                     "step", "fraction", per_layer(layers_, &LayerCurves::stability)});
  page.add(LineChart{
      "chart-dead", "Dead experts (no token in 100 steps)", "step", "experts", {dead_.series("dead experts")}});
  if (layers_seen_ > layers_.size())
    page.note("layers-not-drawn", std::to_string(layers_seen_ - layers_.size()) + " MoE layers past the first " +
                                      std::to_string(kMaxLayersDrawn) + " are not drawn.");
}

std::string RunPage::subtitle(const json& manifest) const {
  std::string text = std::to_string(train_lines_) + " training lines, " + std::to_string(eval_lines_) +
                     " evaluation lines" + (last_step_ ? "; last step " + integer_text(last_step_) : "");
  const auto field = [&](const char* key) {
    const auto it = manifest.find(key);
    return it != manifest.end() && it->is_string() ? it->get<std::string>() : std::string("?");
  };
  if (manifest.is_object())
    text += "; config hash " + field("config_hash") + ", commit " +
            (manifest.contains("git_commit") ? field("git_commit") : field("commit"));
  if (skipped_.any()) text += "; skipped: " + skipped_.text();
  return text;
}

std::string RunPage::html(const std::string& title, const json& manifest) const {
  Page page;
  page.data["kind"] = "run";
  page.section("Training");
  page.add(LineChart{"chart-loss", "Loss", "step", "nats / token", {loss_.series("loss"), lm_loss_.series("lm_loss")}});
  std::vector<Series> ev = {eval_.series("eval_loss")};
  for (const auto& [name, s] : sources_) ev.push_back(s.series("eval " + name));
  page.add(LineChart{"chart-eval", "Held-out loss, all sources and by source", "step", "nats / token", ev});
  if (sources_not_drawn_)
    page.note("sources-not-drawn", std::to_string(sources_not_drawn_) + " values of sources past the first " +
                                       std::to_string(kMaxSourcesDrawn) + " are not drawn.");
  page.add(LineChart{"chart-lr", "Learning rate", "step", "lr", {lr_.series("lr")}});
  page.add(LineChart{
      "chart-grad-norm", "Gradient norm (before clipping)", "step", "L2 norm", {grad_norm_.series("grad_norm")}});
  page.add(LineChart{"chart-tokens-per-s", "Throughput", "step", "tokens / s", {tokens_per_s_.series("tokens_per_s")}});
  add_routing(page);
  page.section("Alerts");
  if (alert_rows_.empty())
    page.note("alerts", "No routing-health alert fired.");
  else
    page.body +=
        "<table id=\"alerts\"><tr><th>step</th><th class=\"l\">alert</th><th>layer</th><th>expert</th><th>value</th>"
        "<th>threshold</th><th>since step</th></tr>" +
        alert_rows_ + "</table>\n";
  if (alerts_ > kMaxAlertRows)
    page.note("alerts-not-shown", std::to_string(alerts_ - kMaxAlertRows) + " alerts past the first " +
                                      std::to_string(kMaxAlertRows) + " are not listed.");
  page.data["skipped"] = {{"long_lines", skipped_.long_lines},
                          {"not_json", skipped_.not_json},
                          {"odd_lines", skipped_.odd_lines},
                          {"odd_fields", skipped_.odd_fields}};
  return page_html(title, subtitle(manifest), page);
}

}  // namespace

std::string run_page(const std::string& title, int metrics_fd, const json& manifest, Skipped& skipped) {
  RunPage page(skipped);
  if (metrics_fd >= 0) for_each_json_line(metrics_fd, skipped, [&](const json& line) { page.add(line); });
  return page.html(title, manifest);
}

}  // namespace moe::report
