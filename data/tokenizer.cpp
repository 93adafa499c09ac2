// The byte-level tokenizer (see tokenizer.h).
#include "data/tokenizer.h"

namespace moe::data {

std::vector<int32_t> tokenize_bytes(std::string_view text) {
  std::vector<int32_t> tokens(text.size());
  for (size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
  return tokens;
}

std::string detokenize_bytes(const int32_t* tokens, size_t count) {
  std::string text(count, '?');
  for (size_t i = 0; i < count; ++i)
    if (tokens[i] >= 0 && tokens[i] < kByteVocab) text[i] = static_cast<char>(static_cast<unsigned char>(tokens[i]));
  return text;
}

}  // namespace moe::data
