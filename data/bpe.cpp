// BPE training, the tokenizer file, encoding and decoding (see bpe.h).
#include "data/bpe.h"

#include <algorithm>
#include <queue>
#include <sstream>

#include "core/error.h"
#include "data/file_io.h"

namespace moe::data {
namespace {

constexpr const char* kFileMagic = "moe-bpe-tokenizer";
constexpr int kFileVersion = 1;

uint64_t pair_key(int32_t left, int32_t right) { return (uint64_t(uint32_t(left)) << 32) | uint32_t(right); }

// The state of training: the distinct chunks of the sample as symbol sequences with their counts, the
// count of every adjacent pair, and which chunks hold each pair (possibly stale: checked when used).
struct Trainer {
  std::vector<std::vector<int32_t>> words;
  std::vector<int64_t> counts;
  std::unordered_map<uint64_t, int64_t> pair_counts;
  std::unordered_map<uint64_t, std::vector<uint32_t>> where;
  // Max-heap on count, ties to the smallest key; entries may be stale (checked against pair_counts).
  using Entry = std::pair<int64_t, uint64_t>;
  struct Order {
    bool operator()(const Entry& a, const Entry& b) const {
      return a.first != b.first ? a.first < b.first : a.second > b.second;
    }
  };
  std::priority_queue<Entry, std::vector<Entry>, Order> heap;

  void add_pairs(uint32_t w, int64_t sign) {
    const std::vector<int32_t>& word = words[w];
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      const uint64_t key = pair_key(word[i], word[i + 1]);
      pair_counts[key] += sign * counts[w];
      if (sign > 0) where[key].push_back(w);
    }
  }

  // Replaces every (left, right) in the chunks that hold it by `id`; pushes the pairs with `id`.
  void merge(int32_t left, int32_t right, int32_t id) {
    const uint64_t key = pair_key(left, right);
    std::vector<uint32_t> holders = std::move(where[key]);
    where.erase(key);
    std::sort(holders.begin(), holders.end());
    holders.erase(std::unique(holders.begin(), holders.end()), holders.end());
    std::vector<uint64_t> touched;
    for (const uint32_t w : holders) {
      std::vector<int32_t>& word = words[w];
      bool found = false;
      for (size_t i = 0; i + 1 < word.size() && !found; ++i) found = word[i] == left && word[i + 1] == right;
      if (!found) continue;
      add_pairs(w, -1);
      std::vector<int32_t> merged;
      for (size_t i = 0; i < word.size(); ++i) {
        if (i + 1 < word.size() && word[i] == left && word[i + 1] == right) {
          merged.push_back(id);
          ++i;
        } else {
          merged.push_back(word[i]);
        }
      }
      word = std::move(merged);
      add_pairs(w, +1);
      for (size_t i = 0; i + 1 < word.size(); ++i)
        if (word[i] == id || word[i + 1] == id) touched.push_back(pair_key(word[i], word[i + 1]));
    }
    pair_counts.erase(key);
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    for (const uint64_t t : touched) heap.push({pair_counts[t], t});
  }
};

}  // namespace

BpeTokenizer BpeTokenizer::train(const std::vector<std::string_view>& texts, int64_t vocab) {
  MOE_CHECK(vocab >= kFirstMergeId, "vocab " << vocab);
  std::unordered_map<std::string_view, int64_t> chunk_counts;
  for (const std::string_view text : texts) for_each_chunk(text, [&](std::string_view c) { ++chunk_counts[c]; });
  // Sorted, so the chunks' order (and so every tie) does not depend on the hash map.
  std::vector<std::pair<std::string_view, int64_t>> chunks(chunk_counts.begin(), chunk_counts.end());
  std::sort(chunks.begin(), chunks.end());
  Trainer t;
  for (const auto& [chunk, count] : chunks) {
    if (chunk.size() < 2) continue;  // nothing to merge
    t.words.emplace_back(chunk.begin(), chunk.end());
    for (int32_t& s : t.words.back()) s = int32_t(static_cast<unsigned char>(s));
    t.counts.push_back(count);
    t.add_pairs(uint32_t(t.words.size() - 1), +1);
  }
  for (const auto& [key, count] : t.pair_counts) t.heap.push({count, key});
  BpeTokenizer tokenizer;
  while (tokenizer.vocab() < vocab && !t.heap.empty()) {
    const auto [count, key] = t.heap.top();
    t.heap.pop();
    const auto it = t.pair_counts.find(key);
    const int64_t current = it == t.pair_counts.end() ? 0 : it->second;
    if (current != count) {  // stale: put it back with its count now
      if (current > 0) t.heap.push({current, key});
      continue;
    }
    if (count < 2) break;  // a merge seen once teaches nothing
    const int32_t left = int32_t(key >> 32), right = int32_t(key & 0xffffffffu);
    const int32_t id = int32_t(tokenizer.vocab());
    tokenizer.add_merge(left, right);
    t.merge(left, right, id);
  }
  return tokenizer;
}

void BpeTokenizer::add_merge(int32_t left, int32_t right) {
  const int32_t id = int32_t(vocab());
  auto bytes_of = [&](int32_t t) {
    return t < 256 ? std::string(1, char(static_cast<unsigned char>(t))) : bytes_[size_t(t - kFirstMergeId)];
  };
  bytes_.push_back(bytes_of(left) + bytes_of(right));
  merges_.emplace_back(left, right);
  merged_id_[pair_key(left, right)] = id;
}

std::string BpeTokenizer::serialize() const {
  std::ostringstream out;
  out << kFileMagic << " " << kFileVersion << "\nvocab " << vocab() << "\neod " << kEndOfDocument << "\nmerges "
      << merges_.size() << "\n";
  for (const auto& [left, right] : merges_) out << left << " " << right << "\n";
  return out.str();
}

BpeTokenizer BpeTokenizer::parse(const std::string& text, const std::string& origin) {
  std::istringstream in(text);
  std::string magic, vocab_word, eod_word, merges_word;
  int version = 0;
  int64_t vocab = 0, eod = 0, merges = 0;
  in >> magic >> version >> vocab_word >> vocab >> eod_word >> eod >> merges_word >> merges;
  if (!in || magic != kFileMagic || vocab_word != "vocab" || eod_word != "eod" || merges_word != "merges")
    MOE_BAD_INPUT(origin << ": not a moe BPE tokenizer file (it starts with \"" << kFileMagic
                         << " 1\"; see docs/data.md \"Tokenizers\")");
  if (version != kFileVersion)
    MOE_BAD_INPUT(origin << ": tokenizer file version " << version << "; this moe reads version " << kFileVersion);
  if (eod != kEndOfDocument || merges < 0 || vocab != kFirstMergeId + merges)
    MOE_BAD_INPUT(origin << ": vocab " << vocab << ", eod " << eod << " and " << merges
                         << " merges do not fit; expected eod 256 and vocab = 257 + merges");
  BpeTokenizer tokenizer;
  for (int64_t i = 0; i < merges; ++i) {
    int64_t left = -1, right = -1;
    in >> left >> right;
    const int64_t next = kFirstMergeId + i;
    if (!in || left < 0 || right < 0 || left >= next || right >= next || left == kEndOfDocument ||
        right == kEndOfDocument)
      MOE_BAD_INPUT(origin << ": merge " << i << " is damaged; each line holds two ids below " << next
                           << " other than 256");
    tokenizer.add_merge(int32_t(left), int32_t(right));
  }
  return tokenizer;
}

BpeTokenizer BpeTokenizer::load(const std::string& path) {
  // A regular file of bounded size: a FIFO or /dev/zero is refused, not read forever.
  return parse(read_regular_file(path, uint64_t(256) << 20, path + " (tokenizer file)"), path);
}

void BpeTokenizer::encode_chunk(std::string_view chunk, std::vector<int32_t>& symbols) const {
  symbols.assign(chunk.begin(), chunk.end());
  for (int32_t& s : symbols) s = int32_t(static_cast<unsigned char>(s));
  // Apply the earliest-learned merge present, everywhere in the chunk, until none applies.
  while (symbols.size() > 1) {
    int32_t best = -1;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      const auto it = merged_id_.find(pair_key(symbols[i], symbols[i + 1]));
      if (it != merged_id_.end() && (best < 0 || it->second < best)) best = it->second;
    }
    if (best < 0) break;
    const auto [left, right] = merges_[size_t(best - kFirstMergeId)];
    size_t out = 0;
    for (size_t i = 0; i < symbols.size(); ++i) {
      if (i + 1 < symbols.size() && symbols[i] == left && symbols[i + 1] == right) {
        symbols[out++] = best;
        ++i;
      } else {
        symbols[out++] = symbols[i];
      }
    }
    symbols.resize(out);
  }
}

void BpeTokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<int32_t> symbols;
  for_each_chunk(text, [&](std::string_view chunk) {
    encode_chunk(chunk, symbols);
    out.insert(out.end(), symbols.begin(), symbols.end());
  });
}

std::string BpeTokenizer::decode(const int32_t* tokens, size_t count) const {
  std::string text;
  for (size_t i = 0; i < count; ++i) {
    const int32_t t = tokens[i];
    if (t >= 0 && t < 256) text += char(static_cast<unsigned char>(t));
    if (t >= kFirstMergeId && t < vocab()) text += bytes_[size_t(t - kFirstMergeId)];
  }
  return text;
}

void BpeEncoder::encode(std::string_view text, std::vector<int32_t>& out) {
  constexpr size_t kMaxCached = size_t(1) << 20;
  for_each_chunk(text, [&](std::string_view chunk) {
    const auto it = cache_.find(std::string(chunk));
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
    tokenizer_.encode_chunk(chunk, scratch_);
    out.insert(out.end(), scratch_.begin(), scratch_.end());
    if (cache_.size() >= kMaxCached) cache_.clear();
    cache_.emplace(std::string(chunk), scratch_);
  });
}

}  // namespace moe::data
