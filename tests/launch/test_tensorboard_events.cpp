// TensorBoard event files: the TFRecord framing (CRC-32C against published vectors, the masked CRC, the record
// layout), a metrics line's tags and histograms, and the files of a run's starts (their names sort in start
// order, a fresh start removes only this program's events files, a link planted as the directory is refused).
// tests/cli/test_tensorboard.sh reads real runs' files with TensorBoard's own reader.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "core/error.h"
#include "launch/run/event_file.h"
#include "launch/run/tensorboard.h"

namespace fs = std::filesystem;

namespace {

uint64_t read_le(const std::string& s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | uint8_t(s[at + size_t(i)]);
  return v;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Every record of a file, checked as a reader checks them.
std::vector<tensorboard::Event> read_events(const fs::path& p) {
  const std::string bytes = read_file(p);
  std::vector<tensorboard::Event> events;
  for (size_t at = 0; at < bytes.size();) {
    const uint64_t n = read_le(bytes, at, 8);
    EXPECT_EQ(read_le(bytes, at + 8, 4), moe::masked_crc32c(std::string_view(bytes).substr(at, 8)));
    const std::string data = bytes.substr(at + 12, n);
    EXPECT_EQ(read_le(bytes, at + 12 + n, 4), moe::masked_crc32c(data));
    events.emplace_back().ParseFromString(data);
    at += 16 + n;
  }
  return events;
}

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("moe_tb_" + std::to_string(::getpid()) + "_" +
                                               ::testing::UnitTest::GetInstance()->current_test_info()->name());
  TempDir() {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

}  // namespace

// RFC 3720 (iSCSI) B.4's CRC-32C vectors, and the check value of "123456789".
TEST(TensorBoardEvents, Crc32cKnownVectors) {
  EXPECT_EQ(moe::crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(moe::crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(moe::crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) ascending.push_back(char(i)), descending.push_back(char(31 - i));
  EXPECT_EQ(moe::crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(moe::crc32c(descending), 0x113FDB5Cu);
  EXPECT_EQ(moe::crc32c(""), 0u);
}

// TFRecord's mask: rotate right 15, add 0xa282ead8.
TEST(TensorBoardEvents, MaskedCrc) {
  EXPECT_EQ(moe::masked_crc32c(""), 0xa282ead8u);
  EXPECT_EQ(moe::masked_crc32c("123456789"), 0xc78ab0e5u);
  const uint32_t crc = moe::crc32c(std::string(32, '\xff'));
  EXPECT_EQ(moe::masked_crc32c(std::string(32, '\xff')), ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
}

TEST(TensorBoardEvents, RecordLayout) {
  const std::string record = moe::tfrecord("abc");
  ASSERT_EQ(record.size(), 8u + 4 + 3 + 4);
  EXPECT_EQ(read_le(record, 0, 8), 3u);
  EXPECT_EQ(read_le(record, 8, 4), 0x0e4999b0u);  // masked CRC-32C of 03 00 00 00 00 00 00 00
  EXPECT_EQ(record.substr(12, 3), "abc");
  EXPECT_EQ(read_le(record, 15, 4), 0x21f1576eu);
  EXPECT_EQ(moe::tfrecord("").size(), 16u);
}

TEST(TensorBoardEvents, LineTagsAndHistogram) {
  const nlohmann::json line = {{"step", 20},
                               {"lm_loss", 2.5},
                               {"lr", 1e-3},
                               {"threads", 2},
                               {"alerts", nlohmann::json::array({{{"kind", "cv"}, {"value", 3.0}}})},
                               {"data", {{"weights", {{"web", 0.75}, {"code", 0.25}}}}},
                               {"eval_loss_by_source", {{"web", 3.25}}},
                               {"moe", nlohmann::json::array({{{"tokens_per_expert", {5, 0, 3}},
                                                               {"cv", 0.5},
                                                               {"stability", nullptr},
                                                               {"activation", {0.625, 0.0, 0.375}}}})}};
  const tensorboard::Summary s = moe::line_summary(line);
  std::map<std::string, double> scalars;
  const tensorboard::HistogramProto* histo = nullptr;
  for (const auto& v : s.value()) {
    if (v.has_histo()) {
      EXPECT_EQ(v.tag(), "moe/tokens_per_expert/layer_0");
      histo = &v.histo();
    } else {
      scalars[v.tag()] = v.simple_value();
    }
  }
  const std::map<std::string, double> expected = {{"loss/lm_loss", 2.5},       {"train/lr", float(1e-3)},
                                                  {"train/threads", 2},        {"data/weights/web", 0.75},
                                                  {"data/weights/code", 0.25}, {"loss/eval_loss_by_source/web", 3.25},
                                                  {"moe/cv/layer_0", 0.5}};
  EXPECT_EQ(scalars, expected);
  ASSERT_NE(histo, nullptr);
  EXPECT_EQ(std::vector<double>(histo->bucket().begin(), histo->bucket().end()), (std::vector<double>{5, 0, 3}));
  EXPECT_EQ(std::vector<double>(histo->bucket_limit().begin(), histo->bucket_limit().end()),
            (std::vector<double>{1, 2, 3}));
  EXPECT_EQ(histo->min(), 0);
  EXPECT_EQ(histo->max(), 3);
  EXPECT_EQ(histo->num(), 8);
  EXPECT_EQ(histo->sum(), 0 * 5 + 2 * 3);
  EXPECT_EQ(histo->sum_squares(), 4 * 3);
}

// Each start: a new file after the earlier ones in name order, opening with the version and a session start at
// the first step it trains; the lines follow at their steps.
TEST(TensorBoardEvents, StartsWriteNewFilesInOrder) {
  TempDir dir;
  std::vector<fs::path> paths;
  for (int64_t start : {0, 10, 4}) {
    moe::TensorBoardWriter writer(dir.path, start);
    writer.write({{"step", start + 1}, {"loss", 1.0}});
    paths.push_back(writer.path());
  }
  std::vector<fs::path> sorted = paths;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, paths);
  const std::vector<tensorboard::Event> events = read_events(paths[2]);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  EXPECT_EQ(events[1].session_log().status(), tensorboard::SessionLog::START);
  EXPECT_EQ(events[1].step(), 5);
  EXPECT_EQ(events[2].step(), 5);
  EXPECT_EQ(events[2].summary().value(0).tag(), "loss/loss");
}

TEST(TensorBoardEvents, FreshStartRemovesOnlyEventsFiles) {
  TempDir dir;
  { moe::TensorBoardWriter writer(dir.path, 0); }
  std::ofstream(dir.path / "tensorboard" / "notes.txt") << "mine";
  moe::clear_tensorboard(dir.path);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir.path / "tensorboard")) left.push_back(e.path().filename());
  EXPECT_EQ(left, std::vector<std::string>{"notes.txt"});
  moe::clear_tensorboard(dir.path / "missing");  // nothing there: nothing to do
}

TEST(TensorBoardEvents, PlantedLinkRefused) {
  TempDir dir;
  fs::create_directories(dir.path / "elsewhere");
  fs::create_directory_symlink(dir.path / "elsewhere", dir.path / "tensorboard");
  try {
    moe::check_tensorboard_dir(dir.path);
    FAIL() << "a link was accepted";
  } catch (const moe::Error& e) {
    EXPECT_EQ(e.kind(), moe::ErrorKind::BadInput);
    EXPECT_NE(e.message().find("tensorboard"), std::string::npos) << e.message();
  }
  EXPECT_TRUE(fs::is_empty(dir.path / "elsewhere"));
  moe::check_tensorboard_dir(dir.path / "elsewhere");  // missing: fine
}
