// Tests of the data module: byte tokenizer, the embedded corpus (sources, sizes, correct arithmetic),
// train/held-out splits, the stateless loader (determinism, windows, source frequencies) and the
// BadInput errors for bad files and settings.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/corpus.h"
#include "data/loader.h"
#include "data/tokenizer.h"
#include "tests/data/data_test_support.h"

namespace moe::data {
namespace {

namespace fs = std::filesystem;

using namespace test_support;

std::string text_of(const Source& source) {
  std::string text = detokenize_bytes(source.train.data(), source.train.size());
  return text + detokenize_bytes(source.heldout.data(), source.heldout.size());
}

// Evaluates "+", "-", "*" and parentheses with the usual precedence; pos advances past what it read.
int64_t parse_sum(const std::string& s, size_t& pos);
int64_t parse_factor(const std::string& s, size_t& pos) {
  if (pos < s.size() && s[pos] == '(') {
    ++pos;
    const int64_t value = parse_sum(s, pos);
    EXPECT_TRUE(pos < s.size() && s[pos] == ')') << s;
    ++pos;
    return value;
  }
  const size_t begin = pos;
  while (pos < s.size() && std::isdigit(static_cast<unsigned char>(s[pos]))) ++pos;
  EXPECT_GT(pos, begin) << "expected a number at " << begin << " in " << s;
  return pos > begin ? std::stoll(s.substr(begin, pos - begin)) : 0;
}
int64_t parse_product(const std::string& s, size_t& pos) {
  int64_t value = parse_factor(s, pos);
  while (pos < s.size() && s[pos] == '*') value *= parse_factor(s, ++pos);
  return value;
}
int64_t parse_sum(const std::string& s, size_t& pos) {
  int64_t value = parse_product(s, pos);
  while (pos < s.size() && (s[pos] == '+' || s[pos] == '-')) {
    const char op = s[pos];
    const int64_t rhs = parse_product(s, ++pos);
    value = op == '+' ? value + rhs : value - rhs;
  }
  return value;
}

// A source whose token at train position p is base + p, so a window tells where it came from.
Source numbered_source(const std::string& name, double weight, int64_t train_tokens, int64_t heldout_tokens,
                       int32_t base) {
  Source source;
  source.name = name;
  source.weight = weight;
  source.path = "test:" + name;
  for (int64_t p = 0; p < train_tokens + heldout_tokens; ++p)
    (p < train_tokens ? source.train : source.heldout).push_back(base + int32_t(p));
  return source;
}

TEST(Tokenizer, RoundTripsEveryByte) {
  std::string text;
  for (int32_t b = 0; b < 256; ++b) text.push_back(static_cast<char>(b));
  text += "MoE \xe2\x9c\x93";  // UTF-8 is just bytes
  const std::vector<int32_t> tokens = tokenize_bytes(text);
  ASSERT_EQ(tokens.size(), text.size());
  for (int32_t b = 0; b < 256; ++b) EXPECT_EQ(tokens[size_t(b)], b);
  EXPECT_EQ(detokenize_bytes(tokens.data(), tokens.size()), text);
}

TEST(Tokenizer, IdsWithoutAByteBecomeQuestionMarks) {
  const std::vector<int32_t> tokens = {'a', 256, 'b', -1, 1000};
  EXPECT_EQ(detokenize_bytes(tokens.data(), tokens.size()), "a?b??");
}

TEST(EmbeddedCorpus, HasThreeSourcesOfPlausibleSize) {
  const Corpus corpus = embedded_corpus(0.05);
  ASSERT_EQ(corpus.sources.size(), 3u);
  const std::vector<std::string> names = {"prose", "code", "arithmetic"};
  for (size_t i = 0; i < 3; ++i) {
    const Source& source = corpus.sources[i];
    EXPECT_EQ(source.name, names[i]);
    EXPECT_EQ(source.weight, 1.0);
    const size_t total = source.train.size() + source.heldout.size();
    EXPECT_GT(total, 100'000u) << source.name;
    EXPECT_LT(total, 1'000'000u) << source.name;
  }
  validate_corpus(corpus, 1024, 256);  // the default must fit long sequences
  const std::string prose = text_of(corpus.sources[0]), code = text_of(corpus.sources[1]);
  int64_t letters = 0;
  for (const char c : prose) letters += std::isalpha(static_cast<unsigned char>(c)) || c == ' ';
  EXPECT_GT(double(letters) / double(prose.size()), 0.8) << "prose should be mostly words";
  EXPECT_NE(prose.find("hacker"), std::string::npos);
  EXPECT_NE(code.find("#include <"), std::string::npos);
  EXPECT_NE(code.find("template<typename"), std::string::npos);
}

TEST(EmbeddedCorpus, MatchesTheFilesInTheRepository) {
  for (const EmbeddedText& text : embedded_texts()) {
    std::ifstream in(std::string(MOE_DATA_CORPUS_DIR) + "/" + std::string(text.name) + ".txt", std::ios::binary);
    ASSERT_TRUE(in) << text.name;
    const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_TRUE(file == text.bytes) << text.name << " differs from data/corpus; rebuild";
  }
}

TEST(EmbeddedCorpus, ArithmeticLinesAreCorrect) {
  const std::string text(embedded_texts()[2].bytes);
  ASSERT_EQ(embedded_texts()[2].name, "arithmetic");
  std::istringstream lines(text);
  std::string line;
  int64_t checked = 0;
  std::set<char> operators;
  while (std::getline(lines, line)) {
    const size_t equals = line.find('=');
    ASSERT_NE(equals, std::string::npos) << line;
    const std::string lhs = line.substr(0, equals);
    size_t pos = 0;
    const int64_t value = parse_sum(lhs, pos);
    ASSERT_EQ(pos, lhs.size()) << "unparsed rest in " << line;
    ASSERT_EQ(std::to_string(value), line.substr(equals + 1)) << line;
    for (const char c : lhs)
      if (!std::isdigit(static_cast<unsigned char>(c))) operators.insert(c);
    ++checked;
  }
  EXPECT_GT(checked, 10'000);
  EXPECT_EQ(operators, (std::set<char>{'(', ')', '*', '+', '-'}));
}

TEST(Split, HeldOutIsTheLastFractionAndDisjointFromTrain) {
  std::vector<int32_t> tokens(1000);
  for (int32_t i = 0; i < 1000; ++i) tokens[size_t(i)] = i;
  const Source source = make_source("s", "p", 2.0, tokens, 0.1);
  ASSERT_EQ(source.train.size(), 900u);
  ASSERT_EQ(source.heldout.size(), 100u);
  for (int32_t i = 0; i < 900; ++i) EXPECT_EQ(source.train[size_t(i)], i);
  for (int32_t i = 0; i < 100; ++i) EXPECT_EQ(source.heldout[size_t(i)], 900 + i);
  // Rounded to the nearest token: 0.29 * 100 is 28.999999999999996 in binary.
  EXPECT_EQ(make_source("s", "p", 1.0, std::vector<int32_t>(100), 0.29).heldout.size(), 29u);

  for (const Source& embedded : embedded_corpus(0.05).sources) {
    const size_t total = embedded.train.size() + embedded.heldout.size();
    EXPECT_EQ(embedded.heldout.size(), size_t(std::llround(double(total) * 0.05))) << embedded.name;
  }
  const EmbeddedText& prose = embedded_texts()[0];
  EXPECT_EQ(text_of(embedded_corpus(0.05).sources[0]), prose.bytes);
}

TEST(Loader, SameSequenceWhateverOrderInstanceOrLayout) {
  const Corpus corpus = embedded_corpus(0.05);
  const int64_t seq_len = 64, steps = 3, global_batch = 16;
  const Loader first(corpus, 1234, seq_len), second(corpus, 1234, seq_len);
  std::map<std::pair<int64_t, int64_t>, std::vector<int32_t>> serial;
  for (int64_t step = 0; step < steps; ++step)
    for (int64_t i = 0; i < global_batch; ++i) {
      std::vector<int32_t> out(size_t(seq_len + 1));
      first.train_sequence(step, i, out.data());
      serial[{step, i}] = out;
    }
  // The other instance, steps backwards and as two data-parallel ranks each reading its own slice.
  for (int64_t step = steps - 1; step >= 0; --step)
    for (int64_t rank = 1; rank >= 0; --rank)
      for (int64_t local = 0; local < global_batch / 2; ++local) {
        const int64_t i = rank * (global_batch / 2) + local;
        std::vector<int32_t> out(size_t(seq_len + 1));
        second.train_sequence(step, i, out.data());
        EXPECT_EQ(out, serial.at({step, i})) << "step " << step << " index " << i;
        EXPECT_EQ(second.train_source(step, i), first.train_source(step, i));
      }
  // Another seed gives other sequences.
  const Loader other(corpus, 1235, seq_len);
  int64_t same = 0;
  for (const auto& [key, tokens] : serial) {
    std::vector<int32_t> out(size_t(seq_len + 1));
    other.train_sequence(key.first, key.second, out.data());
    same += out == tokens;
  }
  EXPECT_LT(same, int64_t(serial.size()) / 2);
}

TEST(Loader, SequenceIsAWindowOfTheTrainSplitOfItsSource) {
  Corpus corpus;
  corpus.sources.push_back(numbered_source("a", 1.0, 40, 10, 0));
  corpus.sources.push_back(numbered_source("b", 1.0, 11, 10, 100'000));  // seq_len + 3: starts 0, 1, 2
  const int64_t seq_len = 8;
  const Loader loader(corpus, 7, seq_len);
  std::map<int32_t, std::set<int32_t>> starts;
  for (int64_t i = 0; i < 400; ++i) {
    std::vector<int32_t> out(size_t(seq_len + 1));
    loader.train_sequence(5, i, out.data());
    const int32_t source = loader.train_source(5, i);
    const int32_t start = out[0] - (source == 0 ? 0 : 100'000);
    for (int64_t k = 0; k <= seq_len; ++k) ASSERT_EQ(out[size_t(k)], out[0] + k);
    ASSERT_GE(start, 0);
    ASSERT_LE(start + seq_len, int64_t(corpus.sources[size_t(source)].train.size()) - 1) << "past the train split";
    starts[source].insert(start);
  }
  EXPECT_EQ(starts[1], (std::set<int32_t>{0, 1, 2}));
  EXPECT_EQ(starts[0].size(), 32u) << "every start of source a should appear in 400 draws";
  EXPECT_EQ(loader.num_sources(), 2);
  EXPECT_EQ(loader.source_name(1), "b");
}

TEST(Loader, SourceFrequenciesFollowWeights) {
  Corpus corpus;
  const std::vector<double> weights = {1.0, 2.0, 5.0, 0.5};
  double total = 0.0;
  for (size_t s = 0; s < weights.size(); ++s) {
    corpus.sources.push_back(numbered_source(std::string(1, char('a' + s)), weights[s], 20, 20, 0));
    total += weights[s];
  }
  const Loader loader(corpus, 99, 4);
  const int64_t draws = 30'000;
  std::vector<int64_t> counts(weights.size());
  for (int64_t i = 0; i < draws; ++i) ++counts[size_t(loader.train_source(i / 100, i % 100))];
  for (size_t s = 0; s < weights.size(); ++s) {
    const double p = weights[s] / total, expected = double(draws) * p;
    const double sigma = std::sqrt(double(draws) * p * (1.0 - p));
    EXPECT_LE(std::abs(double(counts[s]) - expected), 3.0 * sigma) << "source " << s << " count " << counts[s];
  }
}

TEST(Loader, HeldOutWindowsAreFixedAndNonOverlapping) {
  Corpus corpus;
  corpus.sources.push_back(numbered_source("a", 1.0, 20, 3 * 8 + 1, 0));  // exactly 3 windows
  corpus.sources.push_back(numbered_source("b", 1.0, 20, 3 * 8, 0));      // one token short of 3
  const Loader loader(corpus, 1, 8);
  EXPECT_EQ(loader.heldout_count(0), 3);
  EXPECT_EQ(loader.heldout_count(1), 2);
  for (int64_t j = 0; j < 3; ++j) {
    std::vector<int32_t> out(9);
    loader.heldout_sequence(0, j, out.data());
    for (int64_t k = 0; k <= 8; ++k) EXPECT_EQ(out[size_t(k)], 20 + j * 8 + k);  // held-out follows train
  }
}

TEST(Loader, SplitsOfExactlySeqLenPlusOneTokensWork) {
  TempDir dir("data");
  const int64_t seq_len = 16;
  std::string text;
  for (int64_t i = 0; i < 2 * (seq_len + 1); ++i) text.push_back(char('a' + i % 26));
  const std::string path = dir.write("tiny.txt", text);
  const Corpus corpus = load_corpus({{"tiny", path, 1.0}}, 0.5);
  ASSERT_EQ(corpus.sources[0].train.size(), size_t(seq_len + 1));
  ASSERT_EQ(corpus.sources[0].heldout.size(), size_t(seq_len + 1));
  validate_corpus(corpus, seq_len, 256);
  const Loader loader(corpus, 3, seq_len);
  std::vector<int32_t> out(size_t(seq_len + 1));
  for (int64_t i = 0; i < 10; ++i) {
    loader.train_sequence(0, i, out.data());
    EXPECT_EQ(detokenize_bytes(out.data(), out.size()), text.substr(0, size_t(seq_len + 1)));
  }
  ASSERT_EQ(loader.heldout_count(0), 1);
  loader.heldout_sequence(0, 0, out.data());
  EXPECT_EQ(detokenize_bytes(out.data(), out.size()), text.substr(size_t(seq_len + 1)));

  // One token fewer leaves the train split short.
  const std::string short_path = dir.write("short.txt", text.substr(1));
  expect_bad_input(
      [&] {
        validate_corpus(load_corpus({{"tiny", short_path, 1.0}}, 0.5), seq_len, 256);
      },
      {short_path, "train split has 16 tokens", "seq_len+1 = 17"});
}

TEST(BadInput, FilesThatCannotServeAsSources) {
  TempDir dir("data");
  const std::string missing = dir.path("missing.txt");
  expect_bad_input([&] { load_corpus({{"m", missing, 1.0}}, 0.1); }, {missing, "not found", "'m'"});
  const std::string empty = dir.write("empty.txt", "");
  expect_bad_input([&] { load_corpus({{"e", empty, 1.0}}, 0.1); }, {empty, "empty"});
  const std::string folder = dir.path("");
  expect_bad_input([&] { load_corpus({{"d", folder, 1.0}}, 0.1); }, {folder, "not a regular file"});
  if (::geteuid() != 0) {  // root reads anything
    const std::string locked = dir.write("locked.txt", "text");
    fs::permissions(locked, fs::perms::none);
    expect_bad_input([&] { load_corpus({{"l", locked, 1.0}}, 0.1); }, {locked, "cannot be opened"});
  }
}

TEST(BadInput, SplitsTooShortForTheSequenceLength) {
  TempDir dir("data");
  const std::string path = dir.write("code.txt", std::string(370, 'x'));
  const Corpus corpus = load_corpus({{"code", path, 1.0}}, 0.1);  // 333 train, 37 held out
  expect_bad_input([&] { validate_corpus(corpus, 128, 256); },
                   {"data source 'code' (path " + path + ")", "held-out split has 37 tokens", "seq_len+1 = 129",
                    "larger data.heldout_fraction"});
  expect_bad_input([&] { Loader(corpus, 1, 128); }, {path, "held-out split has 37 tokens"});
  expect_bad_input([&] { validate_corpus(corpus, 400, 256); }, {path, "train split has 333 tokens", "401"});
  expect_bad_input([&] { validate_corpus(corpus, 0, 256); }, {"train.seq_len is 0"});
}

TEST(BadInput, SettingsAndSpecs) {
  TempDir dir("data");
  const std::string path = dir.write("a.txt", std::string(1000, 'a'));
  expect_bad_input(
      [&] {
        validate_corpus(load_corpus({{"a", path, 1.0}}, 0.1), 16, 255);
      },
      {"model.vocab is 255", "256"});
  Corpus wide = load_corpus({{"a", path, 1.0}}, 0.1);
  wide.sources[0].train[3] = 300;
  expect_bad_input([&] { validate_corpus(wide, 16, 256); }, {path, "token 300"});
  for (const double fraction : {0.0, 1.0, -0.5, std::nan("")})
    expect_bad_input([&] { load_corpus({{"a", path, 1.0}}, fraction); }, {"data.heldout_fraction"});
  expect_bad_input([&] { embedded_corpus(0.0); }, {"data.heldout_fraction is 0"});
  for (const double weight : {0.0, -1.0, std::nan("")})
    expect_bad_input([&] { load_corpus({{"a", path, weight}}, 0.1); }, {path, "weight"});
  expect_bad_input([&] { load_corpus({{"a", path, 1.0}, {"a", path, 2.0}}, 0.1); }, {"'a'", "unique"});
  expect_bad_input([&] { load_corpus({{"", path, 1.0}}, 0.1); }, {path, "empty name"});
  expect_bad_input([&] { load_corpus({}, 0.1); }, {"data.sources is empty"});
}

}  // namespace
}  // namespace moe::data
