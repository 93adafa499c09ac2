// The byte-level tokenizer: token t is the byte t, so the vocabulary is 0..255 and every text round
// trips exactly. No merges, no special tokens; a bigger tokenizer would be a new file, not an option here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moe::data {

inline constexpr int64_t kByteVocab = 256;

// Each byte of text becomes one token in 0..255.
std::vector<int32_t> tokenize_bytes(std::string_view text);

// The inverse of tokenize_bytes. A model whose vocab is padded past 256 can sample ids with no byte;
// those become '?' rather than an error, since generated text is for reading, not for round trips.
std::string detokenize_bytes(const int32_t* tokens, size_t count);

}  // namespace moe::data
