// The training text: named sources of byte tokens, each split into a train part and a held-out part
// (its last heldout_fraction). Sources come from the embedded default corpus or from user files.
// Not here: which sequence a step trains on (loader.h), reading the config (launch/).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace moe::data {

// One entry of data.sources in the config. A relative path is taken as given (from the working
// directory); the config module decides what it is relative to.
struct SourceSpec {
  std::string name;
  std::string path;
  double weight = 1.0;
};

struct Source {
  std::string name;
  double weight = 1.0;                  // relative sampling probability (loader.h)
  std::vector<int32_t> train, heldout;  // tokens; heldout follows train in the file, they never overlap
  std::string path;  // where the tokens came from, for messages ("embedded:code.txt" for the default)
};

struct Corpus {
  std::vector<Source> sources;
};

// One text linked into the library (data/corpus/NAME.txt).
struct EmbeddedText {
  std::string_view name;
  std::string_view bytes;
};
// The embedded texts in a fixed order: prose, code, arithmetic.
std::span<const EmbeddedText> embedded_texts();

// The default corpus: sources "prose", "code" and "arithmetic", weight 1 each.
Corpus embedded_corpus(double heldout_fraction);

// One source per spec; each path a text file whose bytes are its tokens. Throws BadInput, naming the
// source and path, for a missing, unreadable or empty file, a duplicate or empty name, a weight that
// is not a positive number, or a heldout_fraction outside (0, 1).
Corpus load_corpus(const std::vector<SourceSpec>& specs, double heldout_fraction);

// Splits tokens into a source: the last round(size * heldout_fraction) tokens are held out.
Source make_source(std::string name, std::string path, double weight, std::vector<int32_t> tokens,
                   double heldout_fraction);

// What the loader needs whatever the vocabulary: at least one source, positive weights, and train and
// held-out splits of at least seq_len + 1 tokens each (one sequence with its shifted targets).
void validate_sources(const Corpus& corpus, int64_t seq_len);
// validate_sources, plus vocab >= 256 (the byte tokenizer) and every token below vocab. Throws BadInput.
void validate_corpus(const Corpus& corpus, int64_t seq_len, int64_t vocab);

}  // namespace moe::data
