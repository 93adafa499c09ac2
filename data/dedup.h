// Deduplication of documents (docs/data.md "Deduplication"): exact (a hash of the normalised text) and
// near-duplicate (MinHash over word shingles, LSH banding to find candidates, the estimated Jaccard
// similarity against the threshold to decide). Decisions are taken in input order, a document being
// compared with the documents kept before it, so the result does not depend on threads.
// Not here: reading documents or writing what is kept (prep.h).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace moe::data {

inline constexpr int kMinHashes = 128;

struct DedupSettings {
  bool exact = true;
  bool near = true;
  double threshold = 0.8;  // estimated Jaccard similarity at or above which a document is a near duplicate
  int shingle_words = 5;   // words per shingle
};

// Lower-cased ASCII letters, every run of white space one space, none at either end.
std::string normalize_for_dedup(std::string_view text);

// What deduplication needs of one document; computed in parallel, judged in order.
struct DedupSignature {
  uint64_t exact = 0;  // xxh3 of the normalised text
  std::array<uint32_t, kMinHashes> minhash{};
  bool empty = true;  // nothing but white space
};
DedupSignature dedup_signature(std::string_view text, const DedupSettings& settings);

// The Jaccard similarity of two signatures' shingle sets, estimated from their MinHashes.
double estimated_jaccard(const DedupSignature& a, const DedupSignature& b);

enum class DedupVerdict : uint8_t { Keep, Exact, Near };

// The documents kept so far: their exact hashes, LSH buckets and one byte of each MinHash (b-bit
// MinHash, 128 bytes a document) to verify candidates. Memory grows with the documents kept, about
// 0.5 KB each, never with their length.
class Deduplicator {
 public:
  explicit Deduplicator(const DedupSettings& settings);
  ~Deduplicator();
  Deduplicator(const Deduplicator&) = delete;
  Deduplicator& operator=(const Deduplicator&) = delete;
  // Judges a document against those kept before it; a kept one is added.
  DedupVerdict judge(const DedupSignature& signature);
  int bands() const { return bands_; }
  int rows() const { return rows_; }

 private:
  struct Table;
  DedupSettings settings_;
  int bands_, rows_;
  std::unique_ptr<Table> exact_, buckets_;
  std::vector<std::array<uint8_t, kMinHashes>> kept_;  // near dedup: the low bytes of each kept MinHash
  int64_t kept_count_ = 0;
};

}  // namespace moe::data
