// `moe import hf DIR --config CONFIG --out RUN_DIR`: a Hugging Face MixtralForCausalLM or Qwen2MoeForCausalLM
// directory (safetensors shards and their index, config.json) as a checkpoint of this project,
// RUN_DIR/checkpoints/step-00000000, that `moe train --config CONFIG --run-dir RUN_DIR` continues from (its newest
// checkpoint, resumed as any other) at any layout. Every check comes before anything is written: config.json against
// CONFIG (each disagreeing size named with its key and both values), a Qwen2-MoE shared-expert gate zero, every
// safetensors header against its file (truncation, offsets, dtypes), every shard of the index present, every tensor
// present with the shape CONFIG makes (a mismatch names the tensor, both shapes and the keys), no tensor without a
// place. The optimizer starts afresh (zero moments, step 0), as do the routing statistics. docs/interop.md.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace moe {

struct ImportHfOptions {
  std::string dir;                     // the Hugging Face model directory
  std::string config_path;             // this project's config of the model to make
  std::vector<std::string> overrides;  // --set KEY=VALUE
  std::string out;                     // the run directory to create
  bool upcycle = false;                // a dense LlamaForCausalLM into the config's MoE model
  double upcycle_noise = 0;            // with upcycle: each expert weight times (1 + this * N(0, 1))
};

// Adds `import` (with its `hf` subcommand) to `app`. Returns the `hf` subcommand.
CLI::App* add_import_command(CLI::App& app, ImportHfOptions& options);

// BadInput (exit 2, nothing written) as said above; progress on `log`.
void run_import_hf(const ImportHfOptions& options, std::ostream& log);

}  // namespace moe
