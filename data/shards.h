// Prepared data on disk (docs/data.md "Prepared data"): token shards, their document index and the
// manifest that lists them with an xxh64 each. The writer used by `moe prep`, and the reader that
// verifies a prepared directory and opens its shards for the loader. Not here: tokenizing,
// deduplication and scoring (prep.h), sampling (loader.h).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/file_io.h"

namespace moe::data {

inline constexpr int kPrepFormatVersion = 1;
inline constexpr const char* kPrepManifestName = "manifest.json";

struct ShardInfo {
  std::string file;   // tokens: little-endian uint16 or uint32, no header
  std::string index;  // document ends: little-endian uint64 token offsets within the shard
  int64_t tokens = 0, documents = 0;
  uint64_t xxh64 = 0, index_xxh64 = 0;
};

// The documents of one quality tier of a source, in input order, each followed by the end-of-document token.
struct SegmentInfo {
  int32_t tier = 0;     // 0 = best
  double weight = 1.0;  // sampling weight per token relative to the other tiers of the source
  int64_t tokens = 0, documents = 0;
  std::vector<ShardInfo> shards;
};

// Documents removed by prep, per source.
struct RemovedCounts {
  int64_t exact = 0, near = 0, quality = 0, empty = 0;
};

struct PreparedSourceInfo {
  std::string name;
  std::vector<std::string> inputs;  // the files read, in order
  int64_t documents_in = 0, bytes_in = 0;
  RemovedCounts removed;
  int64_t skipped_files = 0, skipped_lines = 0;  // inputs that could not be read (prep_input.h)
  int64_t documents = 0, tokens = 0;             // kept, end-of-document tokens included
  std::vector<SegmentInfo> segments;             // one per tier that holds documents, best first
};

struct TokenizerInfo {
  std::string kind;  // "byte" | "bpe"
  std::string file;  // the tokenizer file in the directory ("" for byte)
  uint64_t xxh64 = 0;
  int64_t vocab = 0;  // ids 0..vocab-1, end-of-document included
  int32_t eod = 0;    // the end-of-document token
};

struct PrepManifest {
  int version = kPrepFormatVersion;
  TokenizerInfo tokenizer;
  int32_t token_bytes = 2;                            // 2 when vocab <= 65536, else 4
  nlohmann::json options = nlohmann::json::object();  // the prep settings, for the record
  std::vector<PreparedSourceInfo> sources;
};

nlohmann::json manifest_to_json(const PrepManifest& manifest);
// Throws BadInput naming `path` and the field when the document is not a manifest of this version.
PrepManifest manifest_from_json(const nlohmann::json& document, const std::string& path);

// Writes one segment's shards into `dir`: files NAME.tTIER.NNNNN.bin and .idx, a new shard once one holds
// `shard_tokens` tokens (documents are never split across shards).
class ShardWriter {
 public:
  ShardWriter(std::string dir, std::string stem, int32_t token_bytes, int64_t shard_tokens);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;
  // tokens: (count) of one document, without its end-of-document token, which is appended.
  void append_document(const int32_t* tokens, int64_t count, int32_t eod);
  // Closes the open shard; returns every shard written.
  std::vector<ShardInfo> finish();

 private:
  struct Open;
  void open_shard();
  void close_shard();
  std::string dir_, stem_;
  int32_t token_bytes_;
  int64_t shard_tokens_;
  std::unique_ptr<Open> open_;
  std::vector<ShardInfo> done_;
};

// One segment's tokens, its shards opened in order and read as one sequence (pread, not a map: a shard
// truncated under a running job is an error naming it, not a SIGBUS).
class TokenStream {
 public:
  // vocab: every token read is checked to be below it. max_token: the largest id in the shards, found when
  // they were verified.
  TokenStream(std::vector<ShardFile> shards, int32_t token_bytes, int64_t vocab, int64_t max_token);
  int64_t size() const { return ends_.empty() ? 0 : ends_.back(); }
  int64_t max_token() const { return max_token_; }
  // out: (count) tokens [offset, offset + count), which may span shards. Throws RunFailed naming the shard
  // when it has shrunk or holds an id >= vocab since it was verified.
  void read(int64_t offset, int64_t count, int32_t* out) const;

 private:
  std::vector<ShardFile> shards_;
  std::vector<int64_t> ends_;  // ends_[i]: tokens in shards 0..i
  int32_t token_bytes_;
  int64_t vocab_, max_token_;
};

// A prepared directory opened for training: its manifest, its hash, and the opened shards of the
// sources asked for.
struct PreparedData {
  std::string dir;
  PrepManifest manifest;
  uint64_t manifest_xxh64 = 0;  // of manifest.json's bytes: names this preparation in run manifests
  // Per source asked for (in the order asked), one stream per segment of its manifest entry.
  std::vector<std::vector<std::shared_ptr<const TokenStream>>> streams;
};

// Reads DIR/manifest.json, opens every shard of the sources named in `names` and checks that it has the
// size and xxh64 the manifest gives (and its index too) and no token id at or above the tokenizer's
// vocabulary. Throws BadInput naming the directory and the damaged or missing file, or a name the manifest
// lacks (listing the ones it has).
std::shared_ptr<const PreparedData> open_prepared(const std::string& dir, const std::vector<std::string>& names);

// True when `path` is a directory holding a manifest.json (a prepared directory, not a text file).
bool is_prepared_dir(const std::string& path);

}  // namespace moe::data
