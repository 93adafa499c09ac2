// The byte tokenizer as a tokenizers tokenizer.json: see hf_tokenizer.h.
#include "launch/interop/hf_tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"

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
std::vector<uint32_t> stand_in_points() {
  std::vector<uint32_t> table(256);
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    table[b] = printable ? b : next++;
  }
  return table;
}

std::vector<std::string> byte_stand_ins() {
  std::vector<std::string> table;
  for (uint32_t point : stand_in_points()) table.push_back(utf8(point));
  return table;
}

// UTF-8 of the stand-ins of each byte of `bytes`.
std::string stand_in_text(const std::string& bytes, const std::vector<std::string>& stand_ins) {
  std::string text;
  for (unsigned char b : bytes) text += stand_ins[b];
  return text;
}

// A regular-expression character class of the stand-ins of the bytes of the given chunk classes.
std::string stand_in_class(const std::vector<data::bpe_detail::CharClass>& classes, bool negated = false) {
  std::vector<uint32_t> points;
  const std::vector<uint32_t> stand_ins = stand_in_points();
  for (uint32_t b = 0; b < 256; ++b)
    for (data::bpe_detail::CharClass c : classes)
      if (data::bpe_detail::char_class(static_cast<unsigned char>(b)) == c) points.push_back(stand_ins[b]);
  std::sort(points.begin(), points.end());
  std::string text = negated ? "[^" : "[";
  for (size_t i = 0; i < points.size();) {
    size_t j = i;
    while (j + 1 < points.size() && points[j + 1] == points[j] + 1) ++j;
    char range[32];
    if (j == i)
      std::snprintf(range, sizeof range, "\\x{%04X}", points[i]);
    else
      std::snprintf(range, sizeof range, "\\x{%04X}-\\x{%04X}", points[i], points[j]);
    text += range;
    i = j + 1;
  }
  return text + "]";
}

nlohmann::json byte_level(bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", use_regex}};
}

nlohmann::json bpe_model(nlohmann::json vocab, nlohmann::json merges) {
  return {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", nullptr},
          {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr},
          {"fuse_unk", false},
          {"byte_fallback", false},
          {"ignore_merges", false},
          {"vocab", std::move(vocab)},
          {"merges", std::move(merges)}};
}

}  // namespace

std::string bpe_chunk_regex() {
  using data::bpe_detail::CharClass;
  const std::string L = stand_in_class({CharClass::Letter}), N = stand_in_class({CharClass::Digit}),
                    P = stand_in_class({CharClass::Punct}), S = stand_in_class({CharClass::Space}),
                    W = stand_in_class({CharClass::Space, CharClass::OtherSpace}),
                    not_W = stand_in_class({CharClass::Space, CharClass::OtherSpace}, true);
  const std::string most = std::to_string(data::bpe_detail::kMaxChunk),
                    fewer = std::to_string(data::bpe_detail::kMaxChunk - 1);
  // In for_each_chunk's order: a space joins the run of one class after it (at most kMaxChunk bytes with it); a run
  // of one class; a run of white space, less its last space when a word follows (that space joins the word).
  return S + "(?:" + L + "{1," + fewer + "}|" + N + "{1," + fewer + "}|" + P + "{1," + fewer + "})|" + L + "{1," +
         most + "}|" + N + "{1," + most + "}|" + P + "{1," + most + "}|" + W + "{1," + fewer + "}(?=" + S + not_W +
         ")|" + W + "{1," + most + "}";
}

nlohmann::json bpe_tokenizer_json(const data::BpeTokenizer& bpe, const std::string& origin) {
  const std::vector<std::string> stand_ins = byte_stand_ins();
  std::vector<std::string> tokens(size_t(bpe.vocab()));
  nlohmann::json vocab = nlohmann::json::object();
  std::map<std::string, int32_t> seen;
  for (int32_t id = 0; id < int32_t(bpe.vocab()); ++id) {
    tokens[size_t(id)] =
        id == data::kEndOfDocument ? kEndOfDocumentToken : stand_in_text(bpe.decode(&id, 1), stand_ins);
    const auto [it, fresh] = seen.emplace(tokens[size_t(id)], id);
    if (!fresh)
      MOE_BAD_INPUT(origin << ": ids " << it->second << " and " << id
                           << " are the same bytes; a tokenizers vocabulary cannot hold both; nothing written");
    vocab[tokens[size_t(id)]] = id;
  }
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& [left, right] : bpe.merges()) merges.push_back({tokens[size_t(left)], tokens[size_t(right)]});
  const nlohmann::json split = {
      {"type", "Split"}, {"pattern", {{"Regex", bpe_chunk_regex()}}}, {"behavior", "Isolated"}, {"invert", false}};
  const nlohmann::json end_of_document = {{"id", data::kEndOfDocument},
                                          {"content", kEndOfDocumentToken},
                                          {"single_word", false},
                                          {"lstrip", false},
                                          {"rstrip", false},
                                          {"normalized", false},
                                          {"special", true}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", {end_of_document}},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", {byte_level(false), split}}}},
          {"post_processor", nullptr},
          {"decoder", byte_level(false)},
          {"model", bpe_model(vocab, merges)}};
}

nlohmann::json bpe_tokenizer_config() {
  // End-of-document ends a text; nothing is added around one (training data has no BOS either).
  return {{"tokenizer_class", "PreTrainedTokenizerFast"},
          {"clean_up_tokenization_spaces", false},
          {"eos_token", kEndOfDocumentToken},
          {"add_bos_token", false},
          {"add_eos_token", false}};
}

nlohmann::json byte_tokenizer_json() {
  nlohmann::json vocab = nlohmann::json::object();
  const std::vector<std::string> stand_ins = byte_stand_ins();
  for (int b = 0; b < 256; ++b) vocab[stand_ins[size_t(b)]] = b;
  // No regex split: each byte is one token, and no merges could join them anyway.
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", nlohmann::json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer", byte_level(false)},
          {"post_processor", nullptr},
          {"decoder", byte_level(false)},
          {"model", bpe_model(vocab, nlohmann::json::array())}};
}

nlohmann::json byte_tokenizer_config() {
  // No special tokens: the byte tokenizer has none, and nothing is added around a text.
  return {{"tokenizer_class", "PreTrainedTokenizerFast"},
          {"clean_up_tokenization_spaces", false},
          {"add_bos_token", false},
          {"add_eos_token", false}};
}

}  // namespace moe
