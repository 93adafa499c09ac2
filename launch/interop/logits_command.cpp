// `moe logits`: the checkpoint's forward on given ids or text, as JSON. See logits_command.h.
#include "launch/interop/logits_command.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "data/bpe.h"
#include "data/tokenizer.h"
#include "launch/interop/checkpoint_forward.h"
#include "launch/interop/checkpoint_model.h"

namespace moe {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// One sequence on the CPU: the forward keeps (T, T) attention probabilities per head, 64 MiB a head at 4096.
constexpr int64_t kMaxTokens = 4096;

// "1,2,3" or "1 2 3" (or both separators): ids in [0, vocab).
std::vector<int32_t> parse_tokens(const std::string& text, int64_t vocab) {
  std::vector<int32_t> ids;
  std::string item;
  std::istringstream in(text);
  auto take = [&](const std::string& word) {
    char* end = nullptr;
    errno = 0;
    const long long id = std::strtoll(word.c_str(), &end, 10);
    if (word.empty() || *end != '\0' || errno != 0 || id < 0 || id >= vocab)
      MOE_BAD_INPUT("--tokens: '" << word << "' is not a token id in [0, " << vocab << ") (model.vocab = " << vocab
                                  << ")");
    ids.push_back(int32_t(id));
  };
  while (std::getline(in, item, ',')) {
    std::istringstream words(item);
    std::string word;
    bool any = false;
    while (words >> word) take(word), any = true;
    if (!any) MOE_BAD_INPUT("--tokens '" << text << "': an empty item; expected ids separated by commas or spaces");
  }
  return ids;
}

std::string read_text_file(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(fs::status(path, ec))) MOE_BAD_INPUT("--text-file " << path << ": not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) MOE_BAD_INPUT("--text-file " << path << ": cannot read it (" << std::strerror(errno) << ")");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<int32_t> tokenize(const std::string& text, const CheckpointModel& checkpoint) {
  const ModelTokenizer t = model_tokenizer(checkpoint);
  if (t.kind == "byte") return data::tokenize_bytes(text);
  std::vector<int32_t> ids;
  load_model_bpe(t).encode(text, ids);
  return ids;
}

std::vector<int32_t> input_tokens(const LogitsOptions& o, const CheckpointModel& checkpoint) {
  const int given = !o.tokens.empty() + !o.text.empty() + !o.text_file.empty();
  if (given != 1) MOE_BAD_INPUT("moe logits: give exactly one of --tokens, --text and --text-file");
  const int64_t vocab = checkpoint.config.model.vocab;
  std::vector<int32_t> ids = !o.tokens.empty()
                                 ? parse_tokens(o.tokens, vocab)
                                 : tokenize(o.text_file.empty() ? o.text : read_text_file(o.text_file), checkpoint);
  if (ids.empty()) MOE_BAD_INPUT("moe logits: the input has no tokens");
  for (int32_t id : ids)
    if (id >= vocab) MOE_BAD_INPUT("moe logits: the text encodes to id " << id << ", outside model.vocab = " << vocab);
  if (int64_t(ids.size()) + o.generate > kMaxTokens)
    MOE_BAD_INPUT("moe logits: " << ids.size() << " tokens and --generate " << o.generate << " exceed " << kMaxTokens);
  return ids;
}

// The first largest logit, as torch.argmax takes it.
int32_t greedy(const float* row, int64_t vocab) { return int32_t(std::max_element(row, row + vocab) - row); }

void write_output(const LogitsOptions& o, const json& result) {
  const std::string text = result.dump() + "\n";
  if (o.out.empty()) {
    std::cout << text;
    return;
  }
  // Beside --out under a name of its own, renamed into place when complete.
  const fs::path target(o.out), partial = target.string() + ".partial";
  std::ofstream file(partial, std::ios::binary | std::ios::trunc);
  if (!file || !(file << text) || !(file.close(), file)) {
    std::error_code ec;
    fs::remove(partial, ec);
    MOE_BAD_INPUT("--out " << o.out << ": cannot write it (" << std::strerror(errno) << ")");
  }
  fs::rename(partial, target);
}

void check_out(const std::string& out) {
  if (out.empty()) return;
  std::error_code ec;
  const fs::path target(out);
  if (fs::is_directory(fs::status(target, ec))) MOE_BAD_INPUT("--out " << out << " is a directory; expected a file");
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  if (!fs::is_directory(fs::status(parent, ec)))
    MOE_BAD_INPUT("--out " << out << ": directory " << parent.string() << " does not exist");
}

}  // namespace

CLI::App* add_logits_command(CLI::App& app, LogitsOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "logits",
      "The model of a checkpoint run forward on token ids or text (on the CPU, one process, any training layout): "
      "writes JSON {checkpoint, step, tokens, vocab, logits: one row of model.vocab floats per token, generated}. "
      "The evaluation model, dropless (no capacity limit), as `moe export hf` exports it (docs/interop.md).");
  cmd->add_option("PATH", o.path,
                  "A run directory, a checkpoint root or one checkpoint directory; a run directory or root means its "
                  "newest checkpoint")
      ->required();
  cmd->add_option("--tokens", o.tokens, "Token ids, separated by commas or spaces, each in [0, model.vocab)");
  cmd->add_option("--text", o.text, "Text, encoded by the model's tokenizer (bytes, or the prepared data's BPE)");
  cmd->add_option("--text-file", o.text_file, "A file whose text is encoded as --text is");
  cmd->add_option("--out", o.out, "Write the JSON to this file (replaced); default: standard output");
  cmd->add_option("--generate", o.generate,
                  "Also continue the input greedily (the first largest logit each time) by N tokens: \"generated\"")
      ->check(CLI::Range(int64_t{0}, kMaxTokens));
  cmd->add_option("--threads", o.threads, "CPU threads (0: the machine's cores)")->check(CLI::Range(0, 1024));
  return cmd;
}

void run_logits(const LogitsOptions& o, std::ostream& log) {
  check_out(o.out);
  const CheckpointModel checkpoint = open_checkpoint_model(o.path, log);
  const std::vector<int32_t> tokens = input_tokens(o, checkpoint);
  const int64_t n = int64_t(tokens.size());
  CheckpointForward forward(checkpoint, n + o.generate, o.threads);
  const int64_t V = forward.vocab();
  const std::vector<float> logits = forward.logits(tokens);
  json rows = json::array();
  for (int64_t t = 0; t < n; ++t)
    rows.push_back(std::vector<float>(logits.begin() + t * V, logits.begin() + (t + 1) * V));
  std::vector<int32_t> sequence = tokens, generated;
  for (int64_t i = 0; i < o.generate; ++i) {
    const std::vector<float> next = i == 0 ? logits : forward.logits(sequence);
    generated.push_back(greedy(next.data() + (int64_t(sequence.size()) - 1) * V, V));
    sequence.push_back(generated.back());
  }
  write_output(o, json{{"checkpoint", checkpoint.dir},
                       {"step", checkpoint.step},
                       {"tokens", tokens},
                       {"vocab", V},
                       {"logits", rows},
                       {"generated", generated}});
}

}  // namespace moe
