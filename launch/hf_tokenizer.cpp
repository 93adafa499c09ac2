// The byte tokenizer as a tokenizers tokenizer.json: see hf_tokenizer.h.
#include "launch/hf_tokenizer.h"

#include <string>
#include <vector>

namespace moe {
namespace {

// UTF-8 of code point cp (< 0x800 here).
std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others for code points from 256 on, in
// byte order. tokenizers' ByteLevel pre-tokenizer and decoder use this table.
std::vector<std::string> byte_stand_ins() {
  std::vector<std::string> table(256);
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    table[b] = utf8(printable ? b : next++);
  }
  return table;
}

}  // namespace

nlohmann::json byte_tokenizer_json() {
  nlohmann::json vocab = nlohmann::json::object();
  const std::vector<std::string> stand_ins = byte_stand_ins();
  for (int b = 0; b < 256; ++b) vocab[stand_ins[size_t(b)]] = b;
  // use_regex false: no splitting into words, each byte one token (no merges could join them anyway).
  const nlohmann::json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", nlohmann::json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer", byte_level},
          {"post_processor", nullptr},
          {"decoder", byte_level},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", false},
            {"vocab", vocab},
            {"merges", nlohmann::json::array()}}}};
}

nlohmann::json byte_tokenizer_config() {
  // No special tokens: the byte tokenizer has none, and nothing is added around a text.
  return {{"tokenizer_class", "PreTrainedTokenizerFast"},
          {"clean_up_tokenization_spaces", false},
          {"add_bos_token", false},
          {"add_eos_token", false}};
}

}  // namespace moe
