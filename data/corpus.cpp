// Loading, splitting and validating corpora (see corpus.h). The embedded texts live in
// embedded_corpus.cpp; the sampling of sequences in loader.cpp.
#include "data/corpus.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <system_error>

#include "core/error.h"
#include "data/tokenizer.h"

namespace moe::data {
namespace {

void check_heldout_fraction(double heldout_fraction) {
  // Both ends are excluded: every source needs a held-out split for eval_loss_by_source and a train split.
  if (!(heldout_fraction > 0.0 && heldout_fraction < 1.0))
    MOE_BAD_INPUT("data.heldout_fraction is " << heldout_fraction
                                              << "; it must be above 0 and below 1 (for example 0.05)");
}

std::string describe(const std::string& name, const std::string& path) {
  return MOE_STR_CAT("data source '" << name << "' (path " << path << ")");
}

std::string read_text_file(const SourceSpec& spec) {
  const std::string who = describe(spec.name, spec.path);
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(spec.path, ec);
  if (!std::filesystem::exists(status))
    MOE_BAD_INPUT(who << ": file not found; check data.sources[].path (relative paths are taken from "
                         "the working directory)");
  if (!std::filesystem::is_regular_file(status))
    MOE_BAD_INPUT(who << ": not a regular file; data.sources[].path must name a text file");
  std::ifstream in(spec.path, std::ios::binary);
  if (!in) MOE_BAD_INPUT(who << ": cannot be opened for reading; check its permissions");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) MOE_BAD_INPUT(who << ": read failed; check the file and the disk");
  if (bytes.empty()) MOE_BAD_INPUT(who << ": file is empty; a source needs text to train and evaluate on");
  return bytes;
}

void check_split(const Source& source, const char* split_name, size_t tokens, int64_t seq_len, const char* remedy) {
  if (static_cast<int64_t>(tokens) < seq_len + 1)
    MOE_BAD_INPUT(describe(source.name, source.path)
                  << ": " << split_name << " split has " << tokens
                  << " tokens; it needs at least seq_len+1 = " << seq_len + 1 << "; use a longer file or " << remedy);
}

}  // namespace

Source make_source(std::string name, std::string path, double weight, std::vector<int32_t> tokens,
                   double heldout_fraction) {
  check_heldout_fraction(heldout_fraction);
  const int64_t total = static_cast<int64_t>(tokens.size());
  // Rounded, not truncated, so a fraction such as 0.29 of 100 tokens is 29 and not 28.99999 -> 28.
  const int64_t heldout_tokens = std::llround(static_cast<double>(total) * heldout_fraction);
  Source source;
  source.name = std::move(name);
  source.path = std::move(path);
  source.weight = weight;
  source.heldout.assign(tokens.end() - heldout_tokens, tokens.end());
  tokens.resize(static_cast<size_t>(total - heldout_tokens));
  source.train = std::move(tokens);
  return source;
}

Corpus embedded_corpus(double heldout_fraction) {
  Corpus corpus;
  for (const EmbeddedText& text : embedded_texts()) {
    const std::string name(text.name);
    corpus.sources.push_back(
        make_source(name, "embedded:" + name + ".txt", 1.0, tokenize_bytes(text.bytes), heldout_fraction));
  }
  return corpus;
}

Corpus load_corpus(const std::vector<SourceSpec>& specs, double heldout_fraction) {
  check_heldout_fraction(heldout_fraction);
  if (specs.empty()) MOE_BAD_INPUT("data.sources is empty; list at least one {\"name\", \"path\", \"weight\"}");
  std::set<std::string> names;
  Corpus corpus;
  for (size_t i = 0; i < specs.size(); ++i) {
    const SourceSpec& spec = specs[i];
    if (spec.name.empty())
      MOE_BAD_INPUT("data.sources[" << i << "] (path " << spec.path
                                    << ") has an empty name; give every source "
                                       "a name (it labels eval_loss_by_source)");
    if (!names.insert(spec.name).second)
      MOE_BAD_INPUT(describe(spec.name, spec.path) << ": the name is used by another source too; names must be "
                                                      "unique");
    if (!(std::isfinite(spec.weight) && spec.weight > 0.0))
      MOE_BAD_INPUT(describe(spec.name, spec.path)
                    << ": weight is " << spec.weight << "; it must be a positive number (a relative probability)");
    corpus.sources.push_back(
        make_source(spec.name, spec.path, spec.weight, tokenize_bytes(read_text_file(spec)), heldout_fraction));
  }
  return corpus;
}

void validate_sources(const Corpus& corpus, int64_t seq_len) {
  if (seq_len < 1) MOE_BAD_INPUT("train.seq_len is " << seq_len << "; it must be at least 1");
  if (corpus.sources.empty()) MOE_BAD_INPUT("the corpus has no sources; data.sources needs at least one");
  for (const Source& source : corpus.sources) {
    if (!(std::isfinite(source.weight) && source.weight > 0.0))
      MOE_BAD_INPUT(describe(source.name, source.path)
                    << ": weight is " << source.weight << "; it must be a positive number");
    check_split(source, "train", source.train.size(), seq_len, "a smaller data.heldout_fraction");
    check_split(source, "held-out", source.heldout.size(), seq_len, "a larger data.heldout_fraction");
  }
}

void validate_corpus(const Corpus& corpus, int64_t seq_len, int64_t vocab) {
  if (vocab < kByteVocab)
    MOE_BAD_INPUT("model.vocab is " << vocab << "; the byte tokenizer needs at least " << kByteVocab);
  validate_sources(corpus, seq_len);
  for (const Source& source : corpus.sources)
    for (const std::vector<int32_t>* split : {&source.train, &source.heldout})
      for (const int32_t token : *split)
        if (token < 0 || token >= vocab)
          MOE_BAD_INPUT(describe(source.name, source.path) << ": token " << token << " is outside the vocabulary 0.."
                                                           << vocab - 1 << "; raise model.vocab or fix the data");
}

}  // namespace moe::data
