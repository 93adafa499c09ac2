// Exact and MinHash/LSH deduplication (see dedup.h).
#include "data/dedup.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace moe::data {

// An open-addressing hash table of 64-bit keys to 32-bit values (a document number): a few times smaller
// than std::unordered_map, which matters at millions of documents times 16 bands.
struct Deduplicator::Table {
  std::vector<uint64_t> keys;  // 0 = empty; key 0 is stored as 1
  std::vector<uint32_t> values;
  size_t used = 0;
  Table() : keys(1024, 0), values(1024, 0) {}

  // The value stored under key, or nullptr.
  const uint32_t* find(uint64_t key) const {
    if (key == 0) key = 1;
    const size_t mask = keys.size() - 1;
    for (size_t i = size_t(key) & mask; keys[i] != 0; i = (i + 1) & mask)
      if (keys[i] == key) return &values[i];
    return nullptr;
  }
  // Stores value under key unless the key is there already (the first document of a bucket stays).
  void insert(uint64_t key, uint32_t value) {
    if (key == 0) key = 1;
    if (2 * (used + 1) > keys.size()) grow();
    const size_t mask = keys.size() - 1;
    size_t i = size_t(key) & mask;
    for (; keys[i] != 0; i = (i + 1) & mask)
      if (keys[i] == key) return;
    keys[i] = key, values[i] = value, ++used;
  }
  void grow() {
    std::vector<uint64_t> old_keys(keys.size() * 2, 0);
    std::vector<uint32_t> old_values(values.size() * 2, 0);
    old_keys.swap(keys), old_values.swap(values);
    used = 0;
    for (size_t i = 0; i < old_keys.size(); ++i)
      if (old_keys[i] != 0) insert(old_keys[i], old_values[i]);
  }
};

namespace {

// The multipliers and offsets of the 128 hash functions h_j(x) = (a_j x + b_j) >> 32, from splitmix64.
struct Permutations {
  std::array<uint64_t, kMinHashes> a, b;
  Permutations() {
    uint64_t state = 0x6d6f652d64656475ull;  // "moe-dedu"
    auto next = [&] {
      uint64_t z = (state += 0x9e3779b97f4a7c15ull);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      return z ^ (z >> 31);
    };
    for (int j = 0; j < kMinHashes; ++j) a[size_t(j)] = next() | 1, b[size_t(j)] = next();
  }
};
const Permutations& permutations() {
  static const Permutations p;
  return p;
}

void update_minhash(std::array<uint32_t, kMinHashes>& mins, uint64_t x) {
  const Permutations& p = permutations();
  for (int j = 0; j < kMinHashes; ++j)
    mins[size_t(j)] = std::min(mins[size_t(j)], uint32_t((p.a[size_t(j)] * x + p.b[size_t(j)]) >> 32));
}

}  // namespace

std::string normalize_for_dedup(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  bool space = false;
  for (const char c : text) {
    const bool is_space = c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
    if (is_space) {
      space = !out.empty();
      continue;
    }
    if (space) out += ' ', space = false;
    out += (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c;
  }
  return out;
}

DedupSignature dedup_signature(std::string_view text, const DedupSettings& settings) {
  DedupSignature sig;
  const std::string norm = normalize_for_dedup(text);
  sig.empty = norm.empty();
  sig.exact = XXH3_64bits(norm.data(), norm.size());
  sig.minhash.fill(UINT32_MAX);
  if (sig.empty || !settings.near) return sig;
  // Word starts; a shingle is the text from word i to the end of word i + k - 1 (words are one space apart).
  std::vector<size_t> starts = {0};
  for (size_t i = 0; i < norm.size(); ++i)
    if (norm[i] == ' ') starts.push_back(i + 1);
  const size_t words = starts.size(), k = size_t(settings.shingle_words);
  const size_t shingles = words >= k ? words - k + 1 : 1;
  for (size_t i = 0; i < shingles; ++i) {
    const size_t end = i + k < words ? starts[i + k] - 1 : norm.size();
    update_minhash(sig.minhash, XXH3_64bits(norm.data() + starts[i], end - starts[i]));
  }
  return sig;
}

double estimated_jaccard(const DedupSignature& a, const DedupSignature& b) {
  int equal = 0;
  for (int j = 0; j < kMinHashes; ++j) equal += a.minhash[size_t(j)] == b.minhash[size_t(j)];
  return double(equal) / kMinHashes;
}

Deduplicator::Deduplicator(const DedupSettings& settings)
    : settings_(settings), exact_(std::make_unique<Table>()), buckets_(std::make_unique<Table>()) {
  MOE_CHECK(settings.threshold > 0 && settings.threshold <= 1, "threshold " << settings.threshold);
  // The most rows per band (the fewest false candidates) that still makes a pair at the threshold a
  // candidate with probability >= 0.9: 1 - (1 - t^r)^b.
  rows_ = 1, bands_ = kMinHashes;
  for (const int r : {16, 8, 4, 2}) {
    const int b = kMinHashes / r;
    if (1.0 - std::pow(1.0 - std::pow(settings.threshold, r), b) >= 0.9) {
      rows_ = r, bands_ = b;
      break;
    }
  }
}

Deduplicator::~Deduplicator() = default;

DedupVerdict Deduplicator::judge(const DedupSignature& sig) {
  if (settings_.exact && exact_->find(sig.exact)) return DedupVerdict::Exact;
  // b-bit MinHash: the low byte of each value; unequal values agree on it by chance 1/256 of the time.
  std::array<uint8_t, kMinHashes> low;
  std::vector<uint64_t> band_keys;
  if (settings_.near) {
    for (int j = 0; j < kMinHashes; ++j) low[size_t(j)] = uint8_t(sig.minhash[size_t(j)]);
    constexpr double kChance = 1.0 / 256.0;
    for (int band = 0; band < bands_; ++band) {
      const uint64_t key =
          XXH3_64bits_withSeed(sig.minhash.data() + band * rows_, sizeof(uint32_t) * size_t(rows_), uint64_t(band));
      band_keys.push_back(key);
      const uint32_t* other = buckets_->find(key);
      if (!other) continue;
      int equal = 0;
      for (int j = 0; j < kMinHashes; ++j) equal += low[size_t(j)] == kept_[*other][size_t(j)];
      if ((double(equal) / kMinHashes - kChance) / (1.0 - kChance) >= settings_.threshold) return DedupVerdict::Near;
    }
  }
  const uint32_t id = uint32_t(kept_count_++);
  if (settings_.exact) exact_->insert(sig.exact, id);
  if (settings_.near) {
    for (const uint64_t key : band_keys) buckets_->insert(key, uint32_t(kept_.size()));
    kept_.push_back(low);
  }
  return DedupVerdict::Keep;
}

}  // namespace moe::data
