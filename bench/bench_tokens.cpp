// bench_tokens: the token sequences `moe train` trains on, written to a file, so that another program
// (bench/vs_pytorch.py) trains on the same bytes. For steps 0..steps-1 and sequences 0..global_batch-1 of
// the config's data (the embedded corpus by default), the seq_len + 1 tokens of each sequence as the
// trainer's loader draws them (docs/data.md "How a training sequence is chosen"): little-endian int32, a
// (steps, global_batch, seq_len + 1) array with no header.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "bench_main.h"
#include "core/error.h"
#include "data/loader.h"
#include "launch/config/config.h"
#include "launch/train/train_setup.h"

namespace {

struct Options {
  std::string config;
  std::vector<std::string> sets;
  std::string out;
  int64_t steps = 0;  // 0: train.steps
};

void write_tokens(const Options& o) {
  const moe::Config config = moe::load_config(o.config, o.sets);
  const moe::TrainConfig& tc = config.train;
  const moe::data::Corpus corpus = moe::load_training_corpus(config);
  const moe::data::Loader loader(corpus, tc.seed, tc.seq_len, moe::training_schedule(config, corpus));
  const int64_t steps = o.steps > 0 ? o.steps : tc.steps, row = tc.seq_len + 1;
  std::vector<int32_t> tokens(size_t(tc.global_batch * row));
  std::ofstream out(o.out, std::ios::binary | std::ios::trunc);
  MOE_CHECK(out, "cannot write " << o.out);
  for (int64_t step = 0; step < steps; ++step) {
    for (int64_t i = 0; i < tc.global_batch; ++i) loader.train_sequence(step, i, tokens.data() + i * row);
    out.write(reinterpret_cast<const char*>(tokens.data()), std::streamsize(tokens.size() * sizeof(int32_t)));
  }
  MOE_CHECK(out.flush(), "writing " << o.out);
  std::printf("%lld steps x %lld sequences x %lld tokens to %s\n", static_cast<long long>(steps),
              static_cast<long long>(tc.global_batch), static_cast<long long>(row), o.out.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Writes the token sequences moe train trains on (int32, steps x global_batch x (seq_len + 1))."};
  Options o;
  app.add_option("--config", o.config, "the training config")->required();
  app.add_option("--set", o.sets, "KEY=VALUE override, as moe train --set");
  app.add_option("--out", o.out, "the file to write")->required();
  app.add_option("--steps", o.steps, "steps to write (0: train.steps)")->check(CLI::NonNegativeNumber);
  return moe::bench::parse_and_run(app, argc, argv, "bench_tokens", [&] { write_tokens(o); });
}
