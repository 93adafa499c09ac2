// `moe prep`: prepares a corpus once into token shards that any number of ranks read
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
  std::string max_bad_files = "0.1%", max_bad_lines = "0.1%";
  bool no_exact = false, no_near = false, no_quality = false, quiet = false;
};

// Adds `prep` to `app`; parsing fills `options`. Returns the subcommand.
CLI::App* add_prep_command(CLI::App& app, PrepOptions& options);

// Runs the preparation, printing progress to stderr (unless --quiet) and a summary to stdout. Throws
// moe::Error: BadInput (exit 2) for a bad option, a missing input, more unreadable input files or malformed
// lines than --max-bad-files / --max-bad-lines allow, or an --out that exists or cannot be made; nothing
// is left behind then.
void run_prep_command(PrepOptions& options);

}  // namespace moe
