// Tests of reading prepared shards for training: token ids checked against the tokenizer's vocabulary and
// model.vocab when the shards are opened (a forged or edited manifest is refused before anything runs),
// and shards that change under a reader (truncated, overwritten, replaced) giving an error that names the
// shard instead of a SIGBUS or ids outside the vocabulary.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/corpus.h"
#include "data/file_io.h"
#include "data/loader.h"
#include "data/prep.h"
#include "data/shards.h"
#include "tests/data/data_test_support.h"

namespace moe::data {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace test_support;

std::string paragraph(int i) {
  std::string s;
  for (int k = 0; k < 80; ++k) s += "word" + std::to_string(i * 131 + k * 7) + (k % 10 == 9 ? ".\n" : " ");
  return s;
}

// A prepared directory DIR/prepared of one source "a" with a BPE tokenizer; its manifest.
PrepManifest prepare(const TempDir& dir, const std::string& tokenizer = "train") {
  std::string text;
  for (int i = 0; i < 30; ++i) text += paragraph(i);
  dir.write("a.txt", text);
  PrepSettings s;
  s.inputs = {{"a", dir.path("a.txt")}};
  s.out = dir.path("prepared");
  s.tokenizer = tokenizer;
  s.vocab = 600;
  s.threads = 1;
  s.quality = false;
  s.max_document_bytes = 2000;
  return run_prep(s).manifest;
}

json read_json(const std::string& path) { return json::parse(std::ifstream(path)); }
void write_json(const std::string& path, const json& j) { std::ofstream(path) << j.dump(2); }

Corpus open_a(const TempDir& dir) { return load_corpus({{"a", dir.path("prepared"), 1.0}}, 0.1); }

// Expects fn to throw moe::Error of kind RunFailed whose message holds every needle.
void expect_run_failed(const std::function<void()>& fn, const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "no error thrown; expected RunFailed mentioning " << needles.front();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::RunFailed) << e.message();
    for (const std::string& needle : needles)
      EXPECT_NE(e.message().find(needle), std::string::npos) << "'" << needle << "' not in: " << e.message();
  }
}

TEST(ShardIds, TheLargestIdIsFoundWhenOpenedAndMustFitModelVocab) {
  TempDir dir("shards");
  const PrepManifest m = prepare(dir);
  const Corpus corpus = open_a(dir);
  const int64_t max_token = corpus.sources[0].segments[0].tokens->max_token();
  EXPECT_GE(max_token, 256);  // merges are used
  EXPECT_LT(max_token, m.tokenizer.vocab);
  validate_corpus(corpus, 16, m.tokenizer.vocab);
  expect_bad_input([&] { validate_corpus(corpus, 16, 300); }, {"model.vocab >= " + std::to_string(m.tokenizer.vocab)});

  // The tokenizer's vocabulary fits, yet a token does not (defence in depth: the check names the id).
  Corpus forged = corpus;
  forged.sources[0].origin.vocab = 257;
  expect_bad_input([&] { validate_corpus(forged, 16, 300); },
                   {"holds token id " + std::to_string(max_token), "model.vocab 300"});
}

TEST(ShardIds, AManifestWhoseVocabularyIsSmallerThanItsIdsIsRefused) {
  TempDir dir("shards");
  prepare(dir);
  const std::string manifest = dir.path("prepared/manifest.json");
  json j = read_json(manifest);
  j["tokenizer"]["vocab"] = 300;  // as if written for a smaller tokenizer: ids up to ~600 remain
  write_json(manifest, j);
  expect_bad_input([&] { open_a(dir); }, {"holds token id", "300 ids", ".bin"});

  for (const auto& [field, value, needle] :
       std::vector<std::tuple<std::string, int64_t, std::string>>{{"vocab", 0, "tokenizer.vocab is 0"},
                                                                  {"vocab", int64_t(1) << 40, "tokenizer.vocab is"},
                                                                  {"vocab", 70000, "token_bytes is 2"},
                                                                  {"eod", 600, "tokenizer.eod is 600"},
                                                                  {"eod", -1, "tokenizer.eod is -1"}}) {
    json bad = read_json(manifest);
    bad["tokenizer"]["vocab"] = 600;
    bad["tokenizer"][field] = value;
    write_json(manifest, bad);
    expect_bad_input([&] { open_a(dir); }, {needle});
  }
}

TEST(ShardIds, AForgedShardWithItsHashRewrittenIsRefusedByItsIds) {
  TempDir dir("shards");
  const PrepManifest m = prepare(dir, "byte");
  const ShardInfo& shard = m.sources[0].segments[0].shards[0];
  const std::string path = dir.path("prepared/" + shard.file);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4);
    const char id[2] = {char(0x34), char(0x12)};  // 0x1234: far beyond the 257 byte ids
    f.write(id, 2);
  }
  json j = read_json(dir.path("prepared/manifest.json"));
  j["sources"][0]["segments"][0]["shards"][0]["xxh64"] = hex64(file_xxh64(path));
  write_json(dir.path("prepared/manifest.json"), j);
  expect_bad_input([&] { open_a(dir); }, {shard.file, "holds token id 4660", "257 ids"});
}

// A loader over the prepared source reads every window once: the shards are whole.
void read_everything(const Corpus& corpus) {
  const TokenStream& stream = *corpus.sources[0].segments[0].tokens;
  std::vector<int32_t> tokens(size_t(stream.size()));
  stream.read(0, stream.size(), tokens.data());
}

TEST(ShardReading, AShardTruncatedWhileOpenIsAnErrorNamingIt) {
  for (const int64_t keep : {int64_t(0), int64_t(1), int64_t(1000)}) {
    TempDir dir("shards");
    const PrepManifest m = prepare(dir, "byte");
    const Corpus corpus = open_a(dir);
    read_everything(corpus);
    const Loader loader(corpus, 1, 16);
    std::vector<int32_t> window(17);
    loader.train_sequence(0, 0, window.data());
    const std::string shard = m.sources[0].segments[0].shards[0].file;
    fs::resize_file(dir.path("prepared/" + shard), uint64_t(keep));
    expect_run_failed([&] { read_everything(corpus); }, {shard, "has shrunk", std::to_string(keep) + " bytes"});
    // Every window past the new end fails the same way, through the loader too.
    expect_run_failed(
        [&] {
          for (int64_t i = 0; i < 200; ++i) loader.train_sequence(0, i, window.data());
        },
        {shard, "has shrunk"});
  }
}

TEST(ShardReading, AShardOverwrittenWithIdsOutsideTheVocabularyIsAnErrorNamingIt) {
  TempDir dir("shards");
  const PrepManifest m = prepare(dir, "byte");
  const Corpus corpus = open_a(dir);
  const std::string shard = m.sources[0].segments[0].shards[0].file;
  {
    std::fstream f(dir.path("prepared/" + shard), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(0);
    f.write("\xff\xff", 2);
  }
  expect_run_failed([&] { read_everything(corpus); }, {shard, "token id 65535", "0..256"});
}

TEST(ShardReading, AShardReplacedByRenameKeepsTheOpenedFile) {
  TempDir dir("shards");
  const PrepManifest m = prepare(dir, "byte");
  const Corpus corpus = open_a(dir);
  const TokenStream& stream = *corpus.sources[0].segments[0].tokens;
  std::vector<int32_t> before(size_t(stream.size())), after(size_t(stream.size()));
  stream.read(0, stream.size(), before.data());
  const std::string path = dir.path("prepared/" + m.sources[0].segments[0].shards[0].file);
  dir.write("other.bin", "xy");
  fs::rename(dir.path("other.bin"), path);
  stream.read(0, stream.size(), after.data());
  EXPECT_EQ(before, after);
}

TEST(ShardReading, ShardsAndManifestsThatAreNotRegularFilesAreRefused) {
  TempDir dir("shards");
  const PrepManifest m = prepare(dir, "byte");
  const std::string path = dir.path("prepared/" + m.sources[0].segments[0].shards[0].file);
  fs::remove(path);
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  expect_bad_input([&] { open_a(dir); }, {m.sources[0].segments[0].shards[0].file, "a FIFO", "not a regular file"});
  fs::remove(path);
  fs::create_symlink("/dev/zero", path);
  expect_bad_input([&] { open_a(dir); }, {"a character device"});
  fs::remove(path);
  fs::create_directory(path);
  expect_bad_input([&] { open_a(dir); }, {"a directory"});
}

}  // namespace
}  // namespace moe::data
