// Quality measures, rules and tiers (see quality.h).
#include "data/quality.h"

#include <xxhash.h>

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

namespace moe::data {
namespace {

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }
bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (unsigned char)c >= 0x80; }

std::vector<std::string_view> split_words(std::string_view text) {
  std::vector<std::string_view> words;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && is_space(text[i])) ++i;
    const size_t start = i;
    while (i < text.size() && !is_space(text[i])) ++i;
    if (i > start) words.push_back(text.substr(start, i - start));
  }
  return words;
}

void measure_lines(std::string_view text, QualityMeasures& m) {
  int64_t lines = 0, bullets = 0, ellipses = 0, duplicates = 0;
  std::unordered_set<uint64_t> seen;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    start = end + 1;
    while (!line.empty() && is_space(line.back())) line.remove_suffix(1);
    while (!line.empty() && is_space(line.front())) line.remove_prefix(1);
    if (line.empty()) continue;
    ++lines;
    bullets += line[0] == '-' || line[0] == '*' || line.substr(0, 3) == "\xe2\x80\xa2";  // U+2022 bullet
    ellipses += (line.size() >= 3 && line.substr(line.size() - 3) == "...") ||
                (line.size() >= 3 && line.substr(line.size() - 3) == "\xe2\x80\xa6");  // U+2026 ellipsis
    duplicates += !seen.insert(XXH3_64bits(line.data(), line.size())).second;
  }
  if (lines == 0) return;
  m.bullet_lines = double(bullets) / double(lines);
  m.ellipsis_lines = double(ellipses) / double(lines);
  m.duplicate_lines = double(duplicates) / double(lines);
}

// The repetition measures over word n-grams: the most frequent 2-gram and the duplicated 5-grams.
void measure_ngrams(const std::vector<std::string_view>& words, double chars, QualityMeasures& m) {
  auto ngram_hash = [&](size_t i, size_t n) {
    uint64_t h = 0;
    for (size_t k = 0; k < n; ++k) h = XXH3_64bits_withSeed(words[i + k].data(), words[i + k].size(), h);
    return h;
  };
  auto ngram_chars = [&](size_t i, size_t n) {
    size_t c = 0;
    for (size_t k = 0; k < n; ++k) c += words[i + k].size();
    return double(c);
  };
  std::unordered_map<uint64_t, int64_t> bigrams;
  double top = 0;
  for (size_t i = 0; i + 2 <= words.size(); ++i) {
    const int64_t count = ++bigrams[ngram_hash(i, 2)];
    if (count > 1) top = std::max(top, double(count) * ngram_chars(i, 2));
  }
  m.top_bigram = chars > 0 ? top / chars : 0;
  std::unordered_map<uint64_t, size_t> first;
  std::vector<bool> covered(words.size(), false);
  for (size_t i = 0; i + 5 <= words.size(); ++i) {
    const auto [it, fresh] = first.emplace(ngram_hash(i, 5), i);
    if (fresh) continue;
    for (size_t k = 0; k < 5; ++k) covered[i + k] = covered[it->second + k] = true;
  }
  double dup = 0;
  for (size_t i = 0; i < words.size(); ++i) dup += covered[i] ? double(words[i].size()) : 0.0;
  m.duplicate_fivegrams = chars > 0 ? dup / chars : 0;
}

}  // namespace

QualityMeasures measure_quality(std::string_view text) {
  QualityMeasures m;
  const std::vector<std::string_view> words = split_words(text);
  m.words = int64_t(words.size());
  double word_chars = 0;
  int64_t symbols = 0, alphabetic = 0;
  for (const std::string_view w : words) {
    word_chars += double(w.size());
    alphabetic += std::any_of(w.begin(), w.end(), is_alpha);
    symbols += int64_t(std::count(w.begin(), w.end(), '#'));
    for (size_t at = w.find("..."); at != std::string_view::npos; at = w.find("...", at + 3)) ++symbols;
  }
  int64_t digits = 0, chars = 0;
  for (const char c : text) digits += c >= '0' && c <= '9', chars += !is_space(c);
  if (m.words > 0) {
    m.mean_word_length = word_chars / double(m.words);
    m.symbol_ratio = double(symbols) / double(m.words);
    m.alphabetic_words = double(alphabetic) / double(m.words);
  }
  m.digit_ratio = chars > 0 ? double(digits) / double(chars) : 0;
  measure_lines(text, m);
  measure_ngrams(words, word_chars, m);
  return m;
}

int quality_rules_passed(const QualityMeasures& m) {
  // Gopher's thresholds (the digit ratio is C4-like, the project's own).
  const bool rules[kQualityRules] = {
      m.words >= 50,
      m.words <= 100000,
      m.mean_word_length >= 3 && m.mean_word_length <= 10,
      m.symbol_ratio <= 0.1,
      m.bullet_lines <= 0.9,
      m.ellipsis_lines <= 0.3,
      m.alphabetic_words >= 0.8,
      m.digit_ratio <= 0.2,
      m.duplicate_lines <= 0.3,
      m.top_bigram <= 0.2 && m.duplicate_fivegrams <= 0.15,
  };
  return int(std::count(std::begin(rules), std::end(rules), true));
}

double quality_score(std::string_view text) {
  return double(quality_rules_passed(measure_quality(text))) / kQualityRules;
}

int32_t quality_tier(double score, const std::vector<double>& thresholds) {
  for (size_t t = 0; t < thresholds.size(); ++t)
    if (score >= thresholds[t]) return int32_t(t);
  return int32_t(thresholds.size());
}

}  // namespace moe::data
