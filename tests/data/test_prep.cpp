// Tests of prepared data: the BPE tokenizer (exact round trips, compression, deterministic training, its
// file), deduplication (recall and precision on planted duplicates of known Jaccard similarity, nothing
// removed without duplicates), quality tiers, the prep pipeline (inputs of every kind, the same output
// whatever the threads), shards read back through the loader, damaged shards refused, and the mixing
// schedule (interpolation, realised shares within 3 sigma).
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/bpe.h"
#include "data/corpus.h"
#include "data/dedup.h"
#include "data/loader.h"
#include "data/prep.h"
#include "data/prep_input.h"
#include "data/quality.h"
#include "data/shards.h"
#include "tests/data/data_test_support.h"

namespace moe::data {
namespace {

namespace fs = std::filesystem;

using namespace test_support;

std::string embedded(const char* name) {
  for (const EmbeddedText& t : embedded_texts())
    if (t.name == name) return std::string(t.bytes);
  return "";
}

std::vector<int32_t> encode(const BpeTokenizer& t, const std::string& text) {
  std::vector<int32_t> tokens;
  t.encode(text, tokens);
  return tokens;
}

// ---- Tokenizer ----------------------------------------------------------------------------------------

TEST(Bpe, RoundTripsRandomBytesUtf8AndTheEmbeddedCorpus) {
  const std::string prose = embedded("prose");
  const BpeTokenizer t = BpeTokenizer::train({prose.substr(0, 200000)}, 2000);
  std::mt19937 rng(7);
  std::string random_bytes;
  for (int i = 0; i < 20000; ++i) random_bytes += char(rng() & 0xff);
  const std::string utf8 = "Grüße, 東京 — naïve café ✓ \xf0\x9f\x98\x80\n\t  tabs   and  spaces ";
  for (const std::string& text : {random_bytes, utf8, prose, embedded("code"), embedded("arithmetic")}) {
    const std::vector<int32_t> tokens = encode(t, text);
    EXPECT_EQ(t.decode(tokens.data(), tokens.size()), text);
    BpeEncoder cached(t);
    std::vector<int32_t> again;
    cached.encode(text, again);
    EXPECT_EQ(again, tokens) << "the cached encoder must give the same tokens";
  }
}

TEST(Bpe, ATrainedVocabularyCompressesProseAtLeastTwofold) {
  const std::string prose = embedded("prose");
  const BpeTokenizer t = BpeTokenizer::train({prose}, 4096);
  EXPECT_EQ(t.vocab(), 4096);
  const double bytes_per_token = double(prose.size()) / double(encode(t, prose).size());
  EXPECT_GE(bytes_per_token, 2.0);
}

TEST(Bpe, TrainingIsDeterministicAndTheFileRoundTrips) {
  const std::string text = embedded("code").substr(0, 100000);
  const BpeTokenizer a = BpeTokenizer::train({text}, 1000), b = BpeTokenizer::train({text}, 1000);
  EXPECT_EQ(a.serialize(), b.serialize());
  const BpeTokenizer parsed = BpeTokenizer::parse(a.serialize(), "test");
  EXPECT_EQ(parsed.merges(), a.merges());
  EXPECT_EQ(encode(parsed, text), encode(a, text));
  EXPECT_EQ(a.serialize().rfind("moe-bpe-tokenizer 1\nvocab 1000\neod 256\nmerges 743\n", 0), 0u);
}

TEST(Bpe, DamagedFilesAreRefused) {
  expect_bad_input([] { BpeTokenizer::parse("hello", "tok.bpe"); }, {"tok.bpe", "not a moe BPE tokenizer file"});
  expect_bad_input([] { BpeTokenizer::parse("moe-bpe-tokenizer 1\nvocab 259\neod 256\nmerges 2\n97 98\n", "t"); },
                   {"merge 1 is damaged"});
  expect_bad_input([] { BpeTokenizer::parse("moe-bpe-tokenizer 1\nvocab 258\neod 256\nmerges 1\n97 400\n", "t"); },
                   {"merge 0"});
  expect_bad_input([] { BpeTokenizer::parse("moe-bpe-tokenizer 1\nvocab 300\neod 256\nmerges 1\n97 98\n", "t"); },
                   {"vocab = 257 + merges"});
}

// ---- Deduplication ------------------------------------------------------------------------------------

std::vector<std::string> words_of(const std::string& text) {
  std::vector<std::string> words;
  std::istringstream in(text);
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

// The exact Jaccard similarity of two texts' 5-word shingle sets (after dedup normalisation).
double true_jaccard(const std::string& a, const std::string& b) {
  auto shingles = [](const std::string& text) {
    const std::vector<std::string> w = words_of(normalize_for_dedup(text));
    std::set<std::string> out;
    for (size_t i = 0; i + 5 <= w.size(); ++i)
      out.insert(w[i] + " " + w[i + 1] + " " + w[i + 2] + " " + w[i + 3] + " " + w[i + 4]);
    return out;
  };
  const std::set<std::string> x = shingles(a), y = shingles(b);
  size_t common = 0;
  for (const std::string& s : x) common += y.count(s);
  return double(common) / double(x.size() + y.size() - common);
}

// Documents of random words: `originals` distinct ones, then copies of some of them (exact, with case
// and white space changed, or with a few words replaced: near duplicates), then distant variants
// (many words replaced: similarity well under 0.8) that must be kept.
struct PlantedCorpus {
  std::vector<std::string> documents;
  std::vector<bool> duplicate;  // true Jaccard with the original it was made from >= 0.8
};

PlantedCorpus planted_corpus(uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::string> vocabulary;
  for (int i = 0; i < 3000; ++i) {
    std::string w;
    for (int k = 0, n = 3 + int(rng() % 6); k < n; ++k) w += char('a' + rng() % 26);
    vocabulary.push_back(w);
  }
  auto random_doc = [&] {
    std::vector<std::string> w;
    for (int i = 0; i < 200; ++i) w.push_back(vocabulary[rng() % vocabulary.size()]);
    return w;
  };
  auto join = [](const std::vector<std::string>& w) {
    std::string s;
    for (const std::string& x : w) s += (s.empty() ? "" : " ") + x;
    return s;
  };
  auto replaced = [&](std::vector<std::string> w, int count) {
    for (int i = 0; i < count; ++i) w[rng() % w.size()] = vocabulary[rng() % vocabulary.size()];
    return join(w);
  };
  // Random documents of 200 words from 3000 share no 5-word shingle: only a copy's original can be similar.
  std::vector<std::vector<std::string>> originals;
  PlantedCorpus c;
  for (int i = 0; i < 300; ++i) originals.push_back(random_doc()), c.documents.push_back(join(originals.back()));
  std::vector<std::pair<std::string, size_t>> copies;  // (text, original)
  for (int i = 0; i < 60; ++i) {
    const size_t from = rng() % originals.size();
    std::string copy = join(originals[from]);
    copy[0] = char(std::toupper(copy[0]));
    copies.emplace_back("  " + copy + "\n", from);
  }
  for (int i = 0; i < 120; ++i) {
    const size_t from = rng() % originals.size();
    copies.emplace_back(replaced(originals[from], 1 + int(rng() % 3)), from);
  }
  for (int i = 0; i < 120; ++i) {
    const size_t from = rng() % originals.size();
    copies.emplace_back(replaced(originals[from], 25 + int(rng() % 20)), from);
  }
  std::shuffle(copies.begin(), copies.end(), rng);
  c.duplicate.assign(300, false);
  for (const auto& [text, from] : copies) {
    c.documents.push_back(text);
    c.duplicate.push_back(true_jaccard(text, c.documents[from]) >= 0.8);
  }
  return c;
}

TEST(Dedup, FindsPlantedExactAndNearDuplicatesWithHighRecallAndPrecision) {
  const PlantedCorpus c = planted_corpus(11);
  Deduplicator dedup(DedupSettings{});
  int64_t true_positive = 0, false_positive = 0, false_negative = 0, exact = 0;
  for (size_t i = 0; i < c.documents.size(); ++i) {
    const DedupVerdict v = dedup.judge(dedup_signature(c.documents[i], DedupSettings{}));
    const bool removed = v != DedupVerdict::Keep;
    exact += v == DedupVerdict::Exact;
    true_positive += removed && c.duplicate[i];
    false_positive += removed && !c.duplicate[i];
    false_negative += !removed && c.duplicate[i];
  }
  EXPECT_EQ(exact, 60);  // case and white space do not hide an exact copy
  ASSERT_GT(true_positive, 150);
  const double recall = double(true_positive) / double(true_positive + false_negative);
  const double precision = double(true_positive) / double(true_positive + false_positive);
  EXPECT_GE(recall, 0.95) << true_positive << " found, " << false_negative << " missed";
  EXPECT_GE(precision, 0.95) << false_positive << " removed wrongly";
}

TEST(Dedup, RemovesNothingFromACorpusWithoutDuplicates) {
  const PlantedCorpus c = planted_corpus(5);
  Deduplicator dedup(DedupSettings{});
  for (size_t i = 0; i < 300; ++i)
    EXPECT_EQ(dedup.judge(dedup_signature(c.documents[i], DedupSettings{})), DedupVerdict::Keep) << i;
  // The embedded corpus cut into documents: distinct text, nothing removed either.
  const std::string prose = embedded("prose");
  Deduplicator prose_dedup(DedupSettings{});
  for (size_t at = 0; at + 4096 <= prose.size(); at += 4096)
    EXPECT_EQ(prose_dedup.judge(dedup_signature(prose.substr(at, 4096), DedupSettings{})), DedupVerdict::Keep) << at;
}

// ---- Quality ------------------------------------------------------------------------------------------

TEST(Quality, ProseIsTopTierAndJunkIsNot) {
  const std::string prose = embedded("prose").substr(10000, 3000);
  EXPECT_EQ(quality_score(prose), 1.0);
  EXPECT_EQ(quality_tier(quality_score(prose), {1.0, 0.7}), 0);
  std::string junk;
  for (int i = 0; i < 60; ++i) junk += "### 1234 5678 ... ###\n";
  const QualityMeasures m = measure_quality(junk);
  EXPECT_GT(m.duplicate_lines, 0.9);
  EXPECT_GT(m.digit_ratio, 0.2);
  EXPECT_GT(m.symbol_ratio, 0.1);
  EXPECT_LT(m.alphabetic_words, 0.8);
  EXPECT_EQ(quality_tier(quality_score(junk), {1.0, 0.7}), 2);
  EXPECT_EQ(quality_tier(0.8, {1.0, 0.7}), 1);
}

// ---- The pipeline and shards ----------------------------------------------------------------------------

std::string paragraph(int i) {
  std::string s;
  for (int k = 0; k < 80; ++k) s += "word" + std::to_string(i * 131 + k * 7) + (k % 10 == 9 ? ".\n" : " ");
  return s;
}

PrepSettings small_settings(const TempDir& dir, const std::string& out) {
  PrepSettings s;
  s.out = dir.path(out);
  s.tokenizer = "train";
  s.vocab = 600;
  s.threads = 2;
  s.quality = false;
  s.shard_tokens = 2000;  // several shards per source
  return s;
}

TEST(Prep, ReadsEveryKindOfInputRemovesDuplicatesAndRoundTrips) {
  TempDir dir("prep");
  std::string jsonl;
  for (int i = 0; i < 20; ++i) jsonl += nlohmann::json{{"text", paragraph(i)}, {"id", i}}.dump() + "\n";
  jsonl += nlohmann::json{{"text", paragraph(3)}}.dump() + "\n\n";  // an exact duplicate and a blank line
  dir.write_gz("web/a.jsonl.gz", jsonl);
  dir.write("books/one.txt", paragraph(100));
  dir.write_gz("books/two.txt.gz", paragraph(101));
  dir.write("books/.hidden", "skipped");
  PrepSettings s = small_settings(dir, "prepared");
  s.inputs = {{"web", dir.path("web")}, {"books", dir.path("books")}};
  const PrepResult r = run_prep(s);
  ASSERT_EQ(r.manifest.sources.size(), 2u);
  const PreparedSourceInfo& web = r.manifest.sources[0];
  EXPECT_EQ(web.documents_in, 21);
  EXPECT_EQ(web.removed.exact, 1);
  EXPECT_EQ(web.documents, 20);
  EXPECT_EQ(r.manifest.sources[1].documents, 2);
  EXPECT_EQ(r.manifest.sources[1].inputs.size(), 2u);
  EXPECT_GT(web.segments.at(0).shards.size(), 1u);
  EXPECT_FALSE(fs::exists(dir.path("prepared.partial-" + std::to_string(::getpid()))));

  // Read back: the books' tokens decode to the two files, each followed by end-of-document.
  const BpeTokenizer tokenizer = BpeTokenizer::load(dir.path("prepared/tokenizer.bpe"));
  const std::shared_ptr<const PreparedData> data = open_prepared(dir.path("prepared"), {"books"});
  EXPECT_EQ(data->manifest_xxh64, r.manifest_xxh64);
  const TokenStream& stream = *data->streams.at(0).at(0);
  std::vector<int32_t> tokens(size_t(stream.size()));
  stream.read(0, stream.size(), tokens.data());
  const auto eod = std::find(tokens.begin(), tokens.end(), kEndOfDocument);
  ASSERT_NE(eod, tokens.end());
  EXPECT_EQ(tokenizer.decode(tokens.data(), size_t(eod - tokens.begin())), paragraph(100));
  EXPECT_EQ(tokens.back(), kEndOfDocument);
  EXPECT_EQ(tokenizer.decode(&*(eod + 1), size_t(tokens.end() - eod - 2)), paragraph(101));
}

TEST(Prep, OutputIsTheSameWhateverTheThreads) {
  TempDir dir("prep");
  std::string text;
  for (int i = 0; i < 40; ++i) text += nlohmann::json{{"text", paragraph(i % 30)}}.dump() + "\n";
  dir.write("a.jsonl", text);
  uint64_t hashes[2];
  for (const int threads : {1, 3}) {
    PrepSettings s = small_settings(dir, "out" + std::to_string(threads));
    s.threads = threads;
    s.quality = true;
    s.inputs = {{"a", dir.path("a.jsonl")}};
    hashes[threads == 3] = run_prep(s).manifest_xxh64;
  }
  EXPECT_EQ(hashes[0], hashes[1]);
}

TEST(Prep, TrainsOnPreparedShardsThroughTheLoader) {
  TempDir dir("prep");
  for (int i = 0; i < 30; ++i) dir.write("in/" + std::to_string(100 + i) + ".txt", paragraph(i));
  PrepSettings s = small_settings(dir, "prepared");
  s.inputs = {{"text", dir.path("in")}};
  run_prep(s);
  const Corpus corpus = load_corpus({{"text", dir.path("prepared"), 1.0}}, 0.1);
  ASSERT_TRUE(corpus.sources[0].prepared());
  EXPECT_EQ(corpus.sources[0].origin.kind, "prepared");
  const int64_t vocab = corpus.sources[0].origin.vocab;  // fewer than asked: the sample is small
  EXPECT_GT(vocab, 300);
  EXPECT_LE(vocab, 600);
  validate_corpus(corpus, 32, vocab);
  expect_bad_input([&] { validate_corpus(corpus, 32, 256); }, {"model.vocab >= " + std::to_string(vocab)});
  const Loader loader(corpus, 3, 32);
  std::vector<int32_t> a(33), b(33);
  for (int64_t i = 0; i < 50; ++i) {
    loader.train_sequence(4, i, a.data());
    Loader(corpus, 3, 32).train_sequence(4, i, b.data());
    EXPECT_EQ(a, b);
    for (const int32_t t : a) EXPECT_TRUE(t >= 0 && t < vocab) << t;
  }
  EXPECT_GT(loader.heldout_count(0), 0);
  expect_bad_input(
      [&] {
        load_corpus({{"other", dir.path("prepared"), 1.0}}, 0.1);
      },
      {"has no source 'other'", "'text'"});
}

TEST(Prep, DamagedShardsAreRefusedNamingTheFile) {
  TempDir dir("prep");
  dir.write("a.txt", paragraph(1) + paragraph(2));
  PrepSettings s = small_settings(dir, "prepared");
  s.inputs = {{"a", dir.path("a.txt")}};
  const PrepResult r = run_prep(s);
  const std::string shard = r.manifest.sources[0].segments[0].shards[0].file;
  const std::string path = dir.path("prepared/" + shard);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(10);
    f.put('\x7f');
  }
  expect_bad_input([&] { load_corpus({{"a", dir.path("prepared"), 1.0}}, 0.1); }, {shard, "xxh64", "damaged"});
  fs::resize_file(path, 6);
  expect_bad_input([&] { load_corpus({{"a", dir.path("prepared"), 1.0}}, 0.1); }, {shard, "6 bytes"});
  fs::remove(path);
  expect_bad_input([&] { load_corpus({{"a", dir.path("prepared"), 1.0}}, 0.1); }, {shard, "missing"});
  dir.write("prepared/manifest.json", "{\"format\": \"moe-prep\", \"version\": 1}");
  expect_bad_input([&] { load_corpus({{"a", dir.path("prepared"), 1.0}}, 0.1); }, {"manifest.json", "tokenizer"});
}

TEST(Prep, BadSettingsAndInputsAreRefusedBeforeAnythingIsWritten) {
  TempDir dir("prep");
  dir.write("a.txt", "text");
  dir.write("bad.jsonl", "{\"text\": \"fine\"}\n{\"body\": 1}\n");
  dir.write("cut.txt.gz", "\x1f\x8b\x08\x00garbage");
  PrepSettings s = small_settings(dir, "out");
  s.inputs = {{"a", dir.path("missing.txt")}};
  expect_bad_input([&] { run_prep(s); }, {"missing.txt", "no such file"});
  s.inputs = {{"a b", dir.path("a.txt")}};
  expect_bad_input([&] { run_prep(s); }, {"source name 'a b'"});
  s.inputs = {{"a", dir.path("a.txt")}, {"a", dir.path("a.txt")}};
  expect_bad_input([&] { run_prep(s); }, {"'a' is used by another input"});
  s.inputs = {{"a", dir.path("a.txt")}};
  s.vocab = 100;
  expect_bad_input([&] { run_prep(s); }, {"--vocab 100", ">= 257"});
  s.vocab = 600;
  s.tier_weights = {1, 0.5};
  expect_bad_input([&] { run_prep(s); }, {"--tier-weights", "one per tier, 3"});
  s.tier_weights = {1, 0.5, 0.1};
  s.tokenizer = dir.path("a.txt");
  expect_bad_input([&] { run_prep(s); }, {"a.txt", "not a moe BPE tokenizer file"});
  s.tokenizer = "byte";
  s.inputs = {{"bad", dir.path("bad.jsonl")}};
  expect_bad_input([&] { run_prep(s); }, {"bad.jsonl:2", "\"text\""});
  s.inputs = {{"cut", dir.path("cut.txt.gz")}};
  expect_bad_input([&] { run_prep(s); }, {"cut.txt.gz", "damaged"});
  s.out = dir.path("a.txt");
  s.inputs = {{"a", dir.path("a.txt")}};
  expect_bad_input([&] { run_prep(s); }, {"--out", "exists", "overwrites nothing"});
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir.path(""))) left.push_back(e.path().filename().string());
  EXPECT_EQ(left.size(), 3u) << "a failed prep leaves nothing behind";
}

// ---- Tiers and the mixing schedule ----------------------------------------------------------------------

TEST(Loader, TiersAreSampledByTheirWeights) {
  TempDir dir("prep");
  std::string good, bad;
  const std::string prose = embedded("prose");
  for (int i = 0; i < 40; ++i)
    good += nlohmann::json{{"text", prose.substr(10000 + size_t(i) * 2000, 2000)}}.dump() + "\n";
  for (int i = 0; i < 600; ++i)
    bad += nlohmann::json{{"text", "##1 ##2 ##3 ##4 ##5 ##" + std::to_string(i)}}.dump() + "\n";
  dir.write("mixed.jsonl", good + bad);
  PrepSettings s = small_settings(dir, "prepared");
  s.tokenizer = "byte";
  s.quality = true;
  s.tier_weights = {1.0, 0.5, 0.25};
  s.inputs = {{"mixed", dir.path("mixed.jsonl")}};
  run_prep(s);
  const Corpus corpus = load_corpus({{"mixed", dir.path("prepared"), 1.0}}, 0.1);
  const Source& source = corpus.sources[0];
  ASSERT_EQ(source.segments.size(), 2u);
  EXPECT_EQ(source.segments[0].tier, 0);
  EXPECT_EQ(source.segments[1].tier, 2);
  // A window's tier shows in its tokens: only the low tier's hold '#' among nothing but digits and spaces.
  const int64_t T = 8;
  const Loader loader(corpus, 1, T);
  const double w0 = 1.0 * double(source.segments[0].train - T), w1 = 0.25 * double(source.segments[1].train - T);
  const double p = w1 / (w0 + w1);
  const int64_t n = 4000;
  int64_t low = 0;
  std::vector<int32_t> tokens(size_t(T + 1));
  for (int64_t i = 0; i < n; ++i) {
    loader.train_sequence(i / 100, i % 100, tokens.data());
    low += std::count(tokens.begin(), tokens.end(), '#') > 0 &&
           std::all_of(tokens.begin(), tokens.end(),
                       [](int32_t t) { return (t >= '0' && t <= '9') || t == ' ' || t == '#' || t == kEndOfDocument; });
  }
  EXPECT_LE(std::abs(double(low) - double(n) * p), 3.0 * std::sqrt(double(n) * p * (1 - p)))
      << low << " of " << n << " windows from the low tier";
}

Source tiny_source(const std::string& name) {
  Source s;
  s.name = name;
  s.path = "test:" + name;
  s.train.assign(64, 1);
  s.heldout.assign(64, 1);
  return s;
}

TEST(Schedule, InterpolatesLinearlyAndHoldsTheEnds) {
  const MixSchedule schedule = {{10, {1.0, 0.0}}, {20, {0.0, 2.0}}};
  EXPECT_EQ(schedule_weights(schedule, 0), (std::vector<double>{1.0, 0.0}));   // step 1: before the first point
  EXPECT_EQ(schedule_weights(schedule, 9), (std::vector<double>{1.0, 0.0}));   // step 10
  EXPECT_EQ(schedule_weights(schedule, 14), (std::vector<double>{0.5, 1.0}));  // step 15: half way
  EXPECT_EQ(schedule_weights(schedule, 19), (std::vector<double>{0.0, 2.0}));  // step 20
  EXPECT_EQ(schedule_weights(schedule, 500), (std::vector<double>{0.0, 2.0}));
}

TEST(Schedule, RealisedSharesFollowTheScheduledWeights) {
  Corpus corpus;
  for (const char* name : {"general", "code", "math"}) corpus.sources.push_back(tiny_source(name));
  const MixSchedule schedule = {{1, {1.0, 0.0, 0.0}}, {1000, {0.5, 0.3, 0.2}}, {2000, {0.2, 0.4, 0.4}}};
  const Loader loader(corpus, 42, 8, schedule);
  for (const int64_t step : {0, 300, 999, 1499, 5000}) {
    const std::vector<double> w = loader.weights_at(step);
    double total = 0;
    for (double x : w) total += x;
    std::vector<int64_t> counts(3);
    const int64_t n = 2000;
    for (int64_t i = 0; i < n; ++i) ++counts[size_t(loader.train_source(step, i))];
    for (size_t k = 0; k < 3; ++k) {
      const double p = w[k] / total;
      EXPECT_LE(std::abs(double(counts[k]) - double(n) * p), 3.0 * std::sqrt(double(n) * p * (1 - p)) + 1e-9)
          << "step " << step << " source " << k << ": " << counts[k] << " of " << n << ", weight share " << p;
    }
  }
}

}  // namespace
}  // namespace moe::data
