// metrics.jsonl lines and evaluation.
#include "launch/train_metrics.h"

#include <cmath>
#include <fstream>

namespace moe {
namespace {

// One MoE layer's entry of the metrics line (docs/cli.md).
nlohmann::json moe_metrics(const RouterStepStats& st) {
  double mean = 0, var = 0;
  for (int64_t c : st.tokens_per_expert) mean += double(c);
  mean /= double(st.tokens_per_expert.size());
  for (int64_t c : st.tokens_per_expert) var += (double(c) - mean) * (double(c) - mean);
  var /= double(st.tokens_per_expert.size());
  return {{"tokens_per_expert", st.tokens_per_expert},
          {"dropped", st.dropped},
          {"rerouted", st.rerouted},
          {"fallback", st.fallback},
          {"entropy", st.tokens > 0 ? st.entropy_sum / double(st.tokens) : 0.0},
          {"cv", mean > 0 ? std::sqrt(var) / mean : 0.0}};
}

}  // namespace

std::unique_ptr<MetricsWriter> open_metrics(const std::string& run_dir, bool fresh, int64_t start_step) {
  const std::string path = run_dir + "/metrics.jsonl";
  if (fresh) return std::make_unique<MetricsWriter>(path);
  std::vector<nlohmann::json> kept;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    try {
      nlohmann::json j = nlohmann::json::parse(line);
      if (j.at("step").get<int64_t>() <= start_step) kept.push_back(std::move(j));
    } catch (const std::exception&) {
      // A line cut by a crash: dropped.
    }
  }
  in.close();
  auto metrics = std::make_unique<MetricsWriter>(path);
  for (const nlohmann::json& j : kept) metrics->write(j);
  return metrics;
}

nlohmann::json step_line(int64_t done, const StepResult& r, const StepTiming& timing, int64_t tokens_so_far,
                         const std::vector<MoeLayer<float>*>& moe_layers) {
  nlohmann::json moe = nlohmann::json::array();
  for (MoeLayer<float>* m : moe_layers) moe.push_back(moe_metrics(*m->router_stats()));
  return {{"step", done},
          {"loss", r.loss},
          {"lm_loss", r.lm_loss},
          {"aux_loss", r.aux},
          {"z_loss", r.z},
          {"entropy_loss", r.entropy},
          {"death_loss", r.death},
          {"lr", r.lr},
          {"grad_norm", r.grad_norm},
          {"experts_clipped", r.experts_clipped},
          {"dead_experts", r.dead_experts},
          {"tokens", tokens_so_far},
          {"tokens_per_s", timing.tokens_per_s},
          {"elapsed_s", timing.elapsed_s},
          {"comm_wait_s", timing.comm_wait_s},
          {"ckpt_stall_s", timing.ckpt_stall_s},
          {"moe", moe}};
}

EvalResult evaluate(Trainer& t) {
  const TrainConfig& tc = t.config.train;
  const int64_t micro = tc.micro_batch, T = tc.seq_len;
  const data::Loader& loader = *t.loader;
  EvalResult r;
  std::vector<int32_t> tokens(size_t(micro * (T + 1)));
  double total = 0, total_tokens = 0;
  for (int32_t s = 0; s < loader.num_sources(); ++s) {
    const int64_t n = std::min(tc.eval_sequences, loader.heldout_count(s));
    double source_loss = 0;
    for (int64_t start = 0; start < n; start += micro) {
      const int64_t B = std::min(micro, n - start);
      for (int64_t b = 0; b < B; ++b) loader.heldout_sequence(s, start + b, tokens.data() + b * (T + 1));
      t.model->set_context(false, 0, 0, 0.0, 0);
      source_loss += t.model->forward(tokens.data(), B);
    }
    r.by_source.emplace_back(loader.source_name(s), source_loss / double(n * T));
    total += source_loss;
    total_tokens += double(n * T);
  }
  r.loss = total / total_tokens;
  return r;
}

nlohmann::json eval_line(int64_t done, const EvalResult& ev) {
  nlohmann::json by_source = nlohmann::json::object();
  for (const auto& [name, loss] : ev.by_source) by_source[name] = loss;
  return {{"step", done}, {"eval_loss", ev.loss}, {"eval_loss_by_source", by_source}};
}

std::string eval_text(int64_t done, const EvalResult& ev) {
  std::string text = "eval step " + std::to_string(done) + ": loss " + std::to_string(ev.loss) + " (";
  for (size_t i = 0; i < ev.by_source.size(); ++i)
    text += (i ? ", " : "") + ev.by_source[i].first + " " + std::to_string(ev.by_source[i].second);
  return text + ")";
}

}  // namespace moe
