// The byte-level BPE tokenizer of prepared data (docs/data.md "Tokenizers"): ids 0..255 are the bytes,
// 256 ends a document, and each merge learned in training adds one id from 257 on. Every byte is a token
// of its own, so any input, UTF-8 or not, encodes and decodes back exactly (the byte fallback). Text is
// first cut into chunks (a word with its leading space, a run of digits, of punctuation or of white
// space) and merges never cross a chunk. Not here: the plain byte tokenizer of text sources (tokenizer.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace moe::data {

inline constexpr int32_t kEndOfDocument = 256;
inline constexpr int32_t kFirstMergeId = 257;

// Calls fn(chunk) for each chunk of text, in order; the chunks concatenate to text.
template <typename Fn>
void for_each_chunk(std::string_view text, Fn&& fn);

class BpeTokenizer {
 public:
  // No merges: vocab 257 (bytes and end-of-document).
  BpeTokenizer() = default;

  // Learns merges from the chunks of `texts` until the vocabulary holds `vocab` ids (or no pair occurs
  // twice): each step merges the most frequent adjacent pair, ties going to the smallest (left, right)
  // ids, so training is deterministic. vocab >= 257.
  static BpeTokenizer train(const std::vector<std::string_view>& texts, int64_t vocab);
  // The tokenizer file format (docs/data.md); BadInput naming `origin` when it is not one.
  static BpeTokenizer parse(const std::string& text, const std::string& origin);
  static BpeTokenizer load(const std::string& path);
  std::string serialize() const;

  // Appends the tokens of text (no end-of-document) to out.
  void encode(std::string_view text, std::vector<int32_t>& out) const;
  // The bytes of tokens; end-of-document and ids past the vocabulary decode to nothing.
  std::string decode(const int32_t* tokens, size_t count) const;
  int64_t vocab() const { return kFirstMergeId + int64_t(merges_.size()); }
  const std::vector<std::pair<int32_t, int32_t>>& merges() const { return merges_; }

 private:
  friend class BpeEncoder;
  void add_merge(int32_t left, int32_t right);
  void encode_chunk(std::string_view chunk, std::vector<int32_t>& out) const;

  std::vector<std::pair<int32_t, int32_t>> merges_;  // merge i makes id kFirstMergeId + i
  std::unordered_map<uint64_t, int32_t> merged_id_;  // (left << 32 | right) -> the id it makes
  std::vector<std::string> bytes_;                   // bytes of each merged id, by id - kFirstMergeId
};

// Encodes with a cache of recent chunks (words repeat): one per thread, since the cache is not shared.
class BpeEncoder {
 public:
  explicit BpeEncoder(const BpeTokenizer& tokenizer) : tokenizer_(tokenizer) {}
  void encode(std::string_view text, std::vector<int32_t>& out);

 private:
  const BpeTokenizer& tokenizer_;
  std::unordered_map<std::string, std::vector<int32_t>> cache_;
  std::vector<int32_t> scratch_;
};

// ---- for_each_chunk -------------------------------------------------------------------------------------

namespace bpe_detail {
enum class CharClass : uint8_t { Letter, Digit, Space, OtherSpace, Punct };
inline CharClass char_class(unsigned char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80) return CharClass::Letter;
  if (c >= '0' && c <= '9') return CharClass::Digit;
  if (c == ' ') return CharClass::Space;
  if (c == '\n' || c == '\t' || c == '\r' || c == '\v' || c == '\f') return CharClass::OtherSpace;
  return CharClass::Punct;
}
inline bool is_space(CharClass c) { return c == CharClass::Space || c == CharClass::OtherSpace; }
// Long runs are cut so that encoding (quadratic in a chunk's length) stays fast on odd input.
inline constexpr size_t kMaxChunk = 64;
}  // namespace bpe_detail

template <typename Fn>
void for_each_chunk(std::string_view text, Fn&& fn) {
  using namespace bpe_detail;
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    const size_t start = i;
    CharClass c = char_class(static_cast<unsigned char>(text[i]));
    if (c == CharClass::Space && i + 1 < n && !is_space(char_class(static_cast<unsigned char>(text[i + 1])))) {
      ++i;  // a single space joins the word, number or punctuation after it
      c = char_class(static_cast<unsigned char>(text[i]));
    }
    if (is_space(c)) {
      while (i < n && is_space(char_class(static_cast<unsigned char>(text[i]))) && i - start < kMaxChunk) ++i;
      // Leave the last space to the word that follows, as GPT-2 does.
      if (i < n && i - start > 1 && text[i - 1] == ' ' && !is_space(char_class(static_cast<unsigned char>(text[i]))))
        --i;
    } else {
      while (i < n && char_class(static_cast<unsigned char>(text[i])) == c && i - start < kMaxChunk) ++i;
    }
    fn(text.substr(start, i - start));
  }
}

}  // namespace moe::data
