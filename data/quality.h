// Heuristic quality of a document, after the rules of Gopher (Rae et al. 2021, appendix A) and C4: a
// score that is the fraction of the rules it passes, and the tier that score falls in (docs/data.md
// "Quality tiers"). Documents are down-weighted by tier rather than dropped, unless asked.
// Not here: what is done with the tier (prep.h writes one segment per tier; loader.h samples them).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moe::data {

struct QualityMeasures {
  int64_t words = 0;
  double mean_word_length = 0;
  double symbol_ratio = 0;         // '#' and "..." per word
  double bullet_lines = 0;         // share of lines starting with a bullet
  double ellipsis_lines = 0;       // share of lines ending in "..." or the ellipsis character
  double alphabetic_words = 0;     // share of words holding a letter
  double digit_ratio = 0;          // share of the characters that are digits
  double duplicate_lines = 0;      // share of lines that repeat an earlier line
  double top_bigram = 0;           // characters in the most frequent word 2-gram, as a share of all
  double duplicate_fivegrams = 0;  // characters in word 5-grams seen more than once, as a share of all
};
QualityMeasures measure_quality(std::string_view text);

// The number of rules of docs/data.md's table a document is judged by, and how many it passes.
inline constexpr int kQualityRules = 10;
int quality_rules_passed(const QualityMeasures& m);
// quality_rules_passed / kQualityRules, in [0, 1].
double quality_score(std::string_view text);

// Tier of a score: 0 when score >= thresholds[0], 1 when >= thresholds[1], ..., thresholds.size()
// otherwise. thresholds descending.
int32_t quality_tier(double score, const std::vector<double>& thresholds);

}  // namespace moe::data
