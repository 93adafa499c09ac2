// `moe export hf PATH --out DIR`: a checkpoint as a Hugging Face model directory that transformers loads
// (AutoModelForCausalLM, AutoTokenizer): safetensors shards and model.safetensors.index.json, config.json,
// generation_config.json, tokenizer.json and tokenizer_config.json. Reads the checkpoint of any layout by global
// names, one tensor at a time (memory: the largest tensor, twice); refuses before writing anything what the
// architecture cannot express, a checkpoint that does not verify, and an --out that holds anything but a previous
// export (or anything at all, without --overwrite). Writes into a new directory beside --out, renamed into place
// when complete. docs/interop.md.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

namespace CLI {
class App;
}

namespace moe {

struct ExportHfOptions {
  std::string path;                    // a run directory, checkpoint root or checkpoint
  std::string out;                     // the directory to write
  std::string arch = "auto";           // "auto" | "mixtral" | "qwen2_moe" | "glm4_moe" | "deepseek_v3"
  std::string dtype = "fp32";          // "fp32" | "bf16"
  std::string max_shard_size = "2GB";  // a new safetensors file past this size: N, NKB, NMB, NGB (or KiB, MiB, GiB)
  bool overwrite = false;              // replace an --out that holds a previous export
};

// Adds `export` (with its `hf` subcommand) to `app`. Returns the `hf` subcommand.
CLI::App* add_export_command(CLI::App& app, ExportHfOptions& options);

// BadInput (exit 2, nothing written) as said above; progress and the figures on `log`.
void run_export_hf(const ExportHfOptions& options, std::ostream& log);

}  // namespace moe
