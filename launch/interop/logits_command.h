// `moe logits`: the project's own forward of a checkpoint's model on given token ids or text, writing the
// logits (and, with --generate, greedy continuations) as JSON, so that any other implementation of the model
// (transformers loading `moe export hf`'s directory, for one) can be compared with it. Runs on the CPU, one
// process, whatever layout trained the checkpoint; the model is the evaluation one (no router noise, no
// expert dropout) and dropless (no capacity limit), which is what an exported model computes. Reads the
// checkpoint, writes only --out. docs/interop.md.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace moe {

struct LogitsOptions {
  std::string path;       // a run directory, checkpoint root or checkpoint
  std::string tokens;     // token ids: "1,2,3" or "1 2 3"
  std::string text;       // text, tokenized by the model's tokenizer
  std::string text_file;  // a file of text
  std::string out;        // the JSON file to write; empty: standard output
  int64_t generate = 0;   // greedy continuation of this many tokens
  int threads = 0;        // 0: the cores
};

CLI::App* add_logits_command(CLI::App& app, LogitsOptions& options);

// BadInput (exit 2, nothing written) for a path that is no verified checkpoint, token ids outside the
// vocabulary, text for a model whose tokenizer is not the byte one, or an unwritable --out.
void run_logits(const LogitsOptions& options, std::ostream& log);

}  // namespace moe
