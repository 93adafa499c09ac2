// The project's tokenizers in the form of Hugging Face's tokenizers library (tokenizer.json), so that
// transformers' AutoTokenizer encodes and decodes any text exactly as they do:
// - the byte tokenizer (ids 0..255 the bytes, data/tokenizer.h): a byte-level BPE with no merges, whose vocabulary
//   maps GPT-2's printable stand-in of each byte to the byte's id;
// - the prepared data's BPE (data/bpe.h): the same byte-level vocabulary plus end-of-document (256, a special
//   token) and each merge's token, the merges in the order learned, and its chunking (data/bpe.h for_each_chunk)
//   as a regular expression over the bytes' stand-ins, split after the ByteLevel step.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "data/bpe.h"

namespace moe {

// tokenizer.json and tokenizer_config.json of the byte tokenizer.
nlohmann::json byte_tokenizer_json();
nlohmann::json byte_tokenizer_config();

// The same for a BPE; BadInput naming `origin` when two ids decode to the same bytes (no tokenizers vocabulary
// can hold both).
nlohmann::json bpe_tokenizer_json(const data::BpeTokenizer& bpe, const std::string& origin);
nlohmann::json bpe_tokenizer_config();
inline constexpr const char* kEndOfDocumentToken = "<|endoftext|>";

// The chunking of data/bpe.h as an Oniguruma regular expression over the ByteLevel stand-ins of the bytes.
std::string bpe_chunk_regex();

}  // namespace moe
