// metrics.jsonl lines and evaluation.
#include "launch/train/train_metrics.h"

#include <cmath>
#include <fstream>

#include "launch/run/run_files.h"

namespace moe {
namespace {

// One MoE layer's entry of the metrics line (docs/cli.md).
nlohmann::json moe_metrics(const RouterStepStats& st, int64_t top_k) {
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
          {"cv", mean > 0 ? std::sqrt(var) / mean : 0.0},
          {"overflow_ratio",
           st.tokens > 0 ? double(st.dropped + st.rerouted + st.fallback) / (double(st.tokens) * double(top_k)) : 0.0},
          {"tau", st.groups > 0 ? st.tau_sum / double(st.groups) : 0.0},
          {"capacity_factor", st.groups > 0 ? st.capacity_factor_sum / double(st.groups) : 0.0}};
}

// One held-out micro-batch forward through the pipeline stages: virtual stage v (chunk c of rank v mod pp, as
// c * pp + rank) takes its input activation from virtual stage v - 1 and passes its output to v + 1. Its token
// losses are staged on the last virtual stage's rank (evaluate reads them).
void pipeline_forward(Trainer& t, const int32_t* tokens, int64_t B) {
  constexpr int kTag = 1 << 20;          // apart from the training schedule's tags (2 * micro-batch, + 1)
  Communicator& pp = *t.groups.data.pp;  // activations: backend memory
  const int stage = pp.rank(), P = pp.size();
  const int64_t last_virtual = P * int64_t(t.chunks.size()) - 1;
  for (size_t c = 0; c < t.chunks.size(); ++c) {
    Model<float>& model = *t.chunks[c];
    const int64_t v = virtual_stage(P, stage, int64_t(c));
    const int64_t n = model.rows(B * t.config.train.seq_len) * t.config.model.d_model;
    Buffer input;
    if (v > 0) {
      input = model.backend().allocate(dtype_of<float>(), n);
      pp.recv(input.data<float>(), n, int((v - 1) % P), kTag + int(v));
    }
    model.forward(0, tokens, B, v > 0 ? input.data<float>() : nullptr);
    // The data plane takes the activation after the forward's queued work (communicator.h): no host wait.
    if (v < last_virtual) pp.send(model.output_activation(0), n, int((v + 1) % P), kTag + int(v + 1));
  }
}

}  // namespace

std::unique_ptr<MetricsWriter> open_metrics(const std::string& run_dir, bool fresh, int64_t start_step) {
  const std::string path = run_dir + "/metrics.jsonl";
  if (fresh) return std::make_unique<MetricsWriter>(path);
  std::vector<nlohmann::json> kept;
  for_each_line(path, [&](const std::string& line) {
    try {
      nlohmann::json j = nlohmann::json::parse(line);
      if (j.at("step").get<int64_t>() <= start_step) kept.push_back(std::move(j));
    } catch (const std::exception&) {
      // A line cut by a crash: dropped.
    }
  });
  auto metrics = std::make_unique<MetricsWriter>(path);
  for (const nlohmann::json& j : kept) metrics->write(j);
  return metrics;
}

nlohmann::json step_line(int64_t done, const StepResult& r, const StepTiming& timing, int64_t tokens_so_far,
                         const std::vector<RouterStepStats>& moe_stats, int64_t top_k) {
  nlohmann::json moe = nlohmann::json::array();
  for (const RouterStepStats& st : moe_stats) moe.push_back(moe_metrics(st, top_k));
  return {{"step", done},
          {"loss", r.loss},
          {"lm_loss", r.lm_loss},
          {"aux_loss", r.aux},
          {"z_loss", r.z},
          {"entropy_loss", r.entropy},
          {"death_loss", r.death},
          {"warmup_loss", r.warmup},
          {"lr", r.lr},
          {"grad_norm", r.grad_norm},
          {"experts_clipped", r.experts_clipped},
          {"dead_experts", r.dead_experts},
          {"tokens", tokens_so_far},
          {"tokens_per_s", timing.tokens_per_s},
          {"elapsed_s", timing.elapsed_s},
          {"comm_wait_s", timing.comm_wait_s},
          {"ckpt_stall_s", timing.ckpt_stall_s},
          {"a2a_wait_s", timing.a2a_wait_s},
          {"host_syncs", timing.host_syncs},
          {"d2h_bytes", timing.d2h_bytes},
          {"threads", timing.threads},
          {"moe", moe}};
}

nlohmann::json data_metrics(const data::Loader& loader, int64_t step, int64_t global_batch) {
  const std::vector<double> weights = loader.weights_at(step);
  double total = 0;
  for (const double w : weights) total += w;
  // The sequences are a pure function of (seed, step, index): rank 0 recounts the whole job's batch.
  std::vector<int64_t> counts(weights.size(), 0);
  for (int64_t i = 0; i < global_batch; ++i) ++counts[size_t(loader.train_source(step, i))];
  nlohmann::json weight_share = nlohmann::json::object(), share = nlohmann::json::object();
  for (int32_t s = 0; s < loader.num_sources(); ++s) {
    weight_share[loader.source_name(s)] = weights[size_t(s)] / total;
    share[loader.source_name(s)] = double(counts[size_t(s)]) / double(global_batch);
  }
  return {{"weights", weight_share}, {"share", share}};
}

EvalResult evaluate(Trainer& t) {
  parameters_before_forward(t);
  const TrainConfig& tc = t.config.train;
  const int64_t micro = tc.micro_batch, T = tc.seq_len;
  const data::Loader& loader = *t.loader;
  EvalResult r;
  std::vector<int32_t> tokens(size_t(micro * (T + 1)));
  double total = 0, total_tokens = 0;
  // The losses stay on the backend of the rank with the head until the pass's end (read sooner only when more
  // forwards than a step's micro-batches fill its staging): each source's sum is its forwards' sums in order.
  Model<float>& last = *t.chunks.back();
  const bool head = last.stage().head;
  if (head) last.stage_losses();
  std::vector<int64_t> forwards;  // per source
  for (int32_t s = 0; s < loader.num_sources(); ++s) {
    const int64_t n = std::min(tc.eval_sequences, loader.heldout_count(s));
    forwards.push_back(0);
    for (int64_t start = 0; start < n; start += micro, ++forwards.back()) {
      const int64_t B = std::min(micro, n - start);
      for (int64_t b = 0; b < B; ++b) loader.heldout_sequence(s, start + b, tokens.data() + b * (T + 1));
      for (const auto& chunk : t.chunks) chunk->set_context(false, 0, 0, 0.0, 0);
      if (t.pipeline)
        pipeline_forward(t, tokens.data(), B);
      else
        t.model->forward(tokens.data(), B);
    }
  }
  const std::vector<double> sums = head ? last.staged_losses() : std::vector<double>();
  size_t next = 0;
  for (int32_t s = 0; s < loader.num_sources(); ++s) {
    double source_loss = 0;
    for (int64_t f = 0; f < forwards[size_t(s)]; ++f) source_loss += head ? sums[next++] : 0.0;
    r.by_source.emplace_back(loader.source_name(s), source_loss);
  }
  if (t.pipeline) {  // the losses are the last stage's
    std::vector<double> sums;
    for (const auto& [name, sum] : r.by_source) sums.push_back(sum);
    t.groups.pp->allreduce_sum(sums.data(), int64_t(sums.size()));
    for (size_t s = 0; s < sums.size(); ++s) r.by_source[s].second = sums[s];
  }
  for (int32_t s = 0; s < loader.num_sources(); ++s) {
    const int64_t n = std::min(tc.eval_sequences, loader.heldout_count(s));
    const double source_loss = r.by_source[size_t(s)].second;
    r.by_source[size_t(s)].second = source_loss / double(n * T);
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
