// The texts of the default corpus, linked in from data/corpus/*.txt by the generated .incbin file
// (see data/CMakeLists.txt). Only the symbols are here; splitting is corpus.cpp's.
#include <array>

#include "data/corpus.h"

// Defined by embedded_corpus_data.S. The size is a symbol of its own so no end symbol arithmetic
// crosses the C++/assembly boundary.
#define MOE_EMBEDDED_TEXT(name)                      \
  extern "C" const char moe_corpus_##name##_begin[]; \
  extern "C" const uint64_t moe_corpus_##name##_size;
MOE_EMBEDDED_TEXT(prose)
MOE_EMBEDDED_TEXT(code)
MOE_EMBEDDED_TEXT(arithmetic)
#undef MOE_EMBEDDED_TEXT

namespace moe::data {

std::span<const EmbeddedText> embedded_texts() {
  static const std::array<EmbeddedText, 3> texts = {{
      {"prose", {moe_corpus_prose_begin, moe_corpus_prose_size}},
      {"code", {moe_corpus_code_begin, moe_corpus_code_size}},
      {"arithmetic", {moe_corpus_arithmetic_begin, moe_corpus_arithmetic_size}},
  }};
  return texts;
}

}  // namespace moe::data
