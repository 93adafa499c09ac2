// The byte tokenizer (ids 0..255 are the bytes) in the form of Hugging Face's tokenizers library: a byte-level
// BPE with no merges, whose vocabulary maps GPT-2's printable stand-in of each byte to the byte's id, so that
// transformers' AutoTokenizer encodes and decodes any text exactly as data/tokenizer.h does. Not here: the
// prepared data's BPE with merges (its chunking has no tokenizers pre-tokenizer yet; export refuses it).
#pragma once

#include <nlohmann/json.hpp>

namespace moe {

// tokenizer.json and tokenizer_config.json for a model of `vocab` >= 256 ids (ids past 255 get no token).
nlohmann::json byte_tokenizer_json();
nlohmann::json byte_tokenizer_config();

}  // namespace moe
