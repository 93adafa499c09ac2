// The training text: named sources of tokens, each split into a train part and a held-out part
// (its last heldout_fraction). Sources come from the embedded default corpus, from user text files
// (byte tokens, held in memory) or from directories prepared by `moe prep` (shards read as needed).
// Not here: which sequence a step trains on (loader.h), reading the config (launch/).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace moe::data {

class TokenStream;  // data/shards.h

// One entry of data.sources in the config. A relative path is taken as given (from the working
// directory); the config module decides what it is relative to. A path naming a prepared directory
// takes that directory's source called `name`.
struct SourceSpec {
  std::string name;
  std::string path;
  double weight = 1.0;
};

// The tokens of one quality tier of a prepared source, read from its shards as needed. Its train split is tokens
// [0, train), its held-out split the next `heldout` tokens (the segment's last heldout_fraction).
struct Segment {
  std::shared_ptr<const TokenStream> tokens;
  int64_t train = 0, heldout = 0;
  double weight = 1.0;  // sampling weight per token, relative to the source's other segments (its tier's)
  int32_t tier = 0;
};

// Where a source's tokens come from, for run manifests and checkpoints (provenance).
struct SourceOrigin {
  std::string kind;                // "embedded" | "text" | "prepared"
  uint64_t content_xxh64 = 0;      // of the text's bytes, or of the prepared directory's manifest.json
  std::string tokenizer = "byte";  // "byte" or "bpe"
  uint64_t tokenizer_xxh64 = 0;    // the tokenizer file's (0 for byte)
  int64_t vocab = 256;             // token ids are below this
};

struct Source {
  std::string name;
  double weight = 1.0;                  // relative sampling probability (loader.h)
  std::vector<int32_t> train, heldout;  // in-memory tokens; heldout follows train in the file, no overlap
  std::vector<Segment> segments;        // prepared sources: their tokens (train and heldout stay empty)
  std::string path;  // where the tokens came from, for messages ("embedded:code.txt" for the default)
  SourceOrigin origin;
  bool prepared() const { return !segments.empty(); }
  int64_t train_tokens() const;  // over every segment for a prepared source
  int64_t heldout_tokens() const;
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

// One source per spec; each path a text file whose bytes are its tokens, or a prepared directory (see
// SourceSpec). Prepared shards are verified (sizes, xxh64, token ids) when opened. Throws BadInput,
// naming the source and path, for a missing, unreadable, empty or damaged file, a duplicate or empty
// name, a weight that is not a positive number, or a heldout_fraction outside (0, 1).
Corpus load_corpus(const std::vector<SourceSpec>& specs, double heldout_fraction);

// Splits tokens into a source: the last round(size * heldout_fraction) tokens are held out.
Source make_source(std::string name, std::string path, double weight, std::vector<int32_t> tokens,
                   double heldout_fraction);

// Where the corpus came from, for run manifests and checkpoints: per source its name, kind, path, the
// xxh64 of its text (or of its prepared directory's manifest.json) and its tokenizer's, and "xxh64", a
// hash of all that but the paths (moving a prepared directory is not a change of data).
nlohmann::json data_provenance(const Corpus& corpus);

// What the loader needs whatever the vocabulary: at least one source, positive weights, and train and
// held-out splits of at least seq_len + 1 tokens each (one sequence with its shifted targets).
void validate_sources(const Corpus& corpus, int64_t seq_len);
// validate_sources, plus vocab >= every source's vocabulary (256 for bytes; a prepared source's tokenizer
// vocabulary), every in-memory token below vocab and every prepared shard's largest token id (found when
// it was verified) below vocab. Throws BadInput.
void validate_corpus(const Corpus& corpus, int64_t seq_len, int64_t vocab);

}  // namespace moe::data
