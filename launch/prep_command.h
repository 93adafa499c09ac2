// `moe prep`: prepares a corpus once into token shards that any number of ranks memory-map
// (docs/data.md "Preparing data", docs/cli.md). The command line and the progress bar; the pipeline is
// data/prep.h. Does not need MPI.
#pragma once

#include <string>
#include <vector>

#include "data/prep.h"

namespace CLI {
class App;
}

namespace moe {

struct PrepOptions {
  std::vector<std::string> inputs;  // [NAME=]PATH
  data::PrepSettings settings;
  double tokenizer_sample_mb = 32;
  std::string tier_thresholds = "1,0.7", tier_weights = "1,0.5,0.1";
  bool no_exact = false, no_near = false, no_quality = false, quiet = false;
};

// Adds `prep` to `app`; parsing fills `options`. Returns the subcommand.
CLI::App* add_prep_command(CLI::App& app, PrepOptions& options);

// Runs the preparation, printing progress to stderr (unless --quiet) and a summary to stdout. Throws
// moe::Error: BadInput (exit 2) for a bad option, a missing input, a damaged input file or an --out that
// exists; nothing is left behind then.
void run_prep_command(PrepOptions& options);

}  // namespace moe
