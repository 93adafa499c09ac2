// Tests of what `moe prep` reads and where it writes, against careless and hostile inputs: NUL bytes (a
// JSON Lines line is read whole or skipped, never cut; plain text keeps them), lines longer than the bound
// skipped unread, inputs and tokenizer files that are not regular files or too large, unreadable files and
// malformed lines skipped and counted up to a bound and refused past it with nothing written, and --out
// paths that exist, run through a file or a link loop, or end in a slash.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/bpe.h"
#include "data/prep.h"
#include "data/prep_input.h"
#include "data/prep_output.h"
#include "data/shards.h"
#include "tests/data/data_test_support.h"

namespace moe::data {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace test_support;
using namespace std::string_literals;

// A document of its own words, so no two are duplicates.
std::string doc(int i) {
  std::string s = "document " + std::to_string(i) + ":";
  for (int k = 0; k < 30; ++k) s += " w" + std::to_string(i * 1000 + k);
  return s;
}
std::string line(int i) { return json{{"text", doc(i)}}.dump() + "\n"; }

PrepSettings byte_settings(const TempDir& dir, const std::string& source_path) {
  PrepSettings s;
  s.inputs = {{"a", source_path}};
  s.out = dir.path("out");
  s.tokenizer = "byte";
  s.threads = 2;
  s.quality = false;
  return s;
}

// The documents of source "a" of a prepared directory, decoded from byte tokens.
std::vector<std::string> documents_of(const std::string& prepared) {
  const std::shared_ptr<const PreparedData> data = open_prepared(prepared, {"a"});
  std::vector<std::string> docs;
  for (const auto& stream : data->streams.at(0)) {
    std::vector<int32_t> tokens(size_t(stream->size()));
    stream->read(0, stream->size(), tokens.data());
    std::string current;
    for (const int32_t t : tokens) {
      if (t == kEndOfDocument) {
        docs.push_back(current);
        current.clear();
      } else {
        current += char(t);
      }
    }
  }
  return docs;
}

// The names in `dir` (not recursive), sorted.
std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// ---- NUL bytes ---------------------------------------------------------------------------------------

TEST(PrepNul, AJsonLinesLineIsReadWholeOrSkippedNeverCut) {
  const std::string escaped = json{{"text", "before\0after "s + doc(1)}}.dump();
  ASSERT_NE(escaped.find("\\u0000"), std::string::npos);
  std::string text = escaped + "\n";                               // 1: read whole, NUL included
  text += "{\"text\": \"raw\0nul "s + doc(2) + "\"}\n";            // 2: a raw NUL in the string
  text += json{{"text", doc(3)}}.dump() + "\0{\"x\": 1}"s + "\n";  // 3: a NUL after the object
  text += "\0"s + line(4);                                         // 4: a NUL first
  text += line(5) + "\0\0\0"s + "\n";                              // 6: NULs alone
  text += line(7);
  for (const bool gz : {false, true}) {
    TempDir sub("prep_in_" + std::to_string(gz));
    const std::string path = gz ? sub.write_gz("x.jsonl.gz", text) : sub.write("x.jsonl", text);
    PrepSettings s = byte_settings(sub, path);
    s.max_bad_lines = {10, false};
    const PrepResult r = run_prep(s);
    const std::vector<std::string> docs = documents_of(s.out);
    ASSERT_EQ(docs.size(), 3u);
    EXPECT_EQ(docs[0], "before\0after "s + doc(1));
    EXPECT_EQ(docs[1], doc(5));
    EXPECT_EQ(docs[2], doc(7));
    EXPECT_EQ(r.skipped.lines, 4);
    EXPECT_EQ(r.lines_total, 7);
    EXPECT_EQ(r.manifest.sources[0].skipped_lines, 4);
    ASSERT_EQ(r.skipped.named_lines.size(), 4u);
    const std::string name = gz ? "x.jsonl.gz" : "x.jsonl";
    EXPECT_NE(r.skipped.named_lines[0].find(name + ":2: a raw NUL byte at byte 14"), std::string::npos)
        << r.skipped.named_lines[0];
    EXPECT_NE(r.skipped.named_lines[0].find("U+0000"), std::string::npos) << r.skipped.named_lines[0];
    EXPECT_NE(r.skipped.named_lines[1].find(name + ":3:"), std::string::npos);
    EXPECT_NE(r.skipped.named_lines[3].find(name + ":6:"), std::string::npos);
  }
}

TEST(PrepNul, PlainTextKeepsEveryByteNulIncluded) {
  TempDir dir("prep_in");
  const std::string text = "a line\0with a NUL\n\0\0 and more "s + doc(1) + "\n";
  for (const bool gz : {false, true}) {
    const std::string path = gz ? dir.write_gz("t.txt.gz", text) : dir.write("t.txt", text);
    PrepSettings s = byte_settings(dir, path);
    s.out = dir.path(gz ? "out_gz" : "out");
    const PrepResult r = run_prep(s);
    EXPECT_EQ(documents_of(s.out), std::vector<std::string>{text});
    EXPECT_EQ(r.skipped.lines, 0);
  }
}

TEST(PrepNul, MalformedLinesPastTheDefaultBoundStopPrepWritingNothing) {
  TempDir dir("prep_in");
  const std::string path = dir.write("in/x.jsonl", line(1) + "{\"text\": \"a\0b\"}\n"s + line(3));
  PrepSettings s = byte_settings(dir, dir.path("in"));
  expect_bad_input([&] { run_prep(s); }, {"1 of 3 JSON Lines lines", "--max-bad-lines 0.1%", "x.jsonl:2:", "Nothing"});
  EXPECT_EQ(names_in(dir.path("")), std::vector<std::string>{"in"});
  // A count bound is judged as soon as it is passed; a percentage once every line is read.
  s.max_bad_lines = {0, false};
  expect_bad_input([&] { run_prep(s); }, {"--max-bad-lines 0 allows (0)", "x.jsonl:2:"});
  s.max_bad_lines = {34, true};  // floor(3 * 0.34) = 1
  EXPECT_EQ(run_prep(s).skipped.lines, 1);
}

TEST(PrepNul, OneBadLineInAThousandIsWithinTheDefaultBound) {
  TempDir dir("prep_in");
  std::string text;
  for (int i = 0; i < 1000; ++i) text += line(i) + (i == 500 ? "{\"text\": 5}\n" : "");
  PrepSettings s = byte_settings(dir, dir.write("x.jsonl", text));
  const PrepResult r = run_prep(s);
  EXPECT_EQ(r.skipped.lines, 1);
  EXPECT_EQ(r.lines_total, 1001);
  EXPECT_NE(r.skipped.named_lines.at(0).find("x.jsonl:502: no string field \"text\""), std::string::npos);
  EXPECT_EQ(r.manifest.sources[0].documents, 1000);
}

// ---- Long lines --------------------------------------------------------------------------------------

TEST(PrepLongLines, ALineLongerThanTheBoundIsSkippedAndCounted) {
  TempDir dir("prep_in");
  const std::string long_line = json{{"text", std::string(5000, 'x')}}.dump() + "\n";
  const std::string text = line(1) + long_line + line(3) + "{\"text\": 1}\n" + line(5) + long_line;  // no '\n' at end
  for (const bool gz : {false, true}) {
    TempDir sub("prep_in_" + std::to_string(gz));
    PrepSettings s = byte_settings(
        sub, gz ? sub.write_gz("x.jsonl.gz", text) : sub.write("x.jsonl", text.substr(0, text.size() - 1)));
    s.max_line_bytes = 1000;
    s.max_bad_lines = {3, false};
    const PrepResult r = run_prep(s);
    EXPECT_EQ(documents_of(s.out), (std::vector<std::string>{doc(1), doc(3), doc(5)}));
    EXPECT_EQ(r.skipped.lines, 3);
    EXPECT_NE(r.skipped.named_lines.at(0).find(":2: longer than --max-line-bytes 1000"), std::string::npos);
    EXPECT_NE(r.skipped.named_lines.at(1).find(":4: no string field"), std::string::npos);
    EXPECT_NE(r.skipped.named_lines.at(2).find(":6: longer than"), std::string::npos);
  }
}

TEST(PrepLongLines, OneHugeCompressedLineIsSkippedNotHeld) {
  TempDir dir("prep_in");
  // 48 MB of one line compress to about 50 KB; with a 1 MiB bound it is passed over in pieces.
  std::string huge = "{\"text\": \"" + std::string(size_t(48) << 20, 'a') + "\"}\n";
  const std::string path = dir.write_gz("big.jsonl.gz", huge + line(2));
  huge.clear();
  huge.shrink_to_fit();
  PrepSettings s = byte_settings(dir, path);
  s.max_line_bytes = int64_t(1) << 20;
  s.max_bad_lines = {1, false};
  const PrepResult r = run_prep(s);
  EXPECT_EQ(documents_of(s.out), std::vector<std::string>{doc(2)});
  EXPECT_NE(r.skipped.named_lines.at(0).find("big.jsonl.gz:1: longer than --max-line-bytes 1048576"),
            std::string::npos);
  s.out = dir.path("out2");
  s.max_bad_lines = {0, false};
  expect_bad_input([&] { run_prep(s); }, {"big.jsonl.gz:1", "--max-line-bytes"});
}

// ---- Files that are not regular, and bounds on whole files -------------------------------------------

TEST(PrepFiles, AFifoOrDeviceIsRefusedAsAnInputOrTokenizerAndSkippedInADirectory) {
  TempDir dir("prep_in");
  ASSERT_EQ(::mkfifo(dir.path("fifo").c_str(), 0600), 0);
  dir.write("in/a.jsonl", line(1) + line(2));
  ASSERT_EQ(::mkfifo(dir.path("in/b.jsonl").c_str(), 0600), 0);
  fs::create_symlink("/dev/zero", dir.path("in/c.txt"));
  fs::create_symlink(dir.path("in/missing"), dir.path("in/d.txt"));
  fs::create_symlink("e.txt", dir.path("in/e.txt"));  // a loop
  PrepSettings s = byte_settings(dir, dir.path("fifo"));
  expect_bad_input([&] { run_prep(s); }, {"fifo", "not a regular file or a directory"});

  s.inputs = {{"a", dir.path("in")}};
  expect_bad_input([&] { run_prep(s); }, {"4 of 5 input files", "--max-bad-files 0.1%", "b.jsonl: a FIFO",
                                          "c.txt: a character device", "d.txt: a dangling symbolic link"});
  s.max_bad_files = {4, false};
  const PrepResult r = run_prep(s);
  EXPECT_EQ(r.skipped.files, 4);
  EXPECT_EQ(r.manifest.sources[0].skipped_files, 4);
  EXPECT_EQ(r.manifest.sources[0].documents, 2);

  s.inputs = {{"a", dir.path("in/a.jsonl")}};
  for (const auto& [tokenizer, needle] : std::vector<std::pair<std::string, std::string>>{
           {dir.path("fifo"), "a FIFO"}, {"/dev/zero", "a character device"}, {dir.path("in"), "a directory"}}) {
    s.tokenizer = tokenizer;
    s.out = dir.path("out_tok");
    expect_bad_input([&] { run_prep(s); }, {"--tokenizer " + tokenizer, needle, "not a regular file"});
  }
  // A regular file too large to be a tokenizer (sparse: no disk used).
  const std::string big = dir.path("big.bpe");
  dir.write("big.bpe", "");
  fs::resize_file(big, (uint64_t(256) << 20) + 1);
  s.tokenizer = big;
  expect_bad_input([&] { run_prep(s); }, {"--tokenizer " + big, "268435457 bytes", "at most 268435456"});
}

TEST(PrepFiles, UnreadableFilesInADirectoryAreSkippedUpToTheBound) {
  TempDir dir("prep_in");
  for (int i = 0; i < 30; ++i) dir.write_gz("in/" + std::to_string(100 + i) + ".jsonl.gz", line(i));
  // One JSON document over many lines, not JSON Lines: no line of it is an object on its own.
  dir.write_gz("in/200.json.gz", json{{"documents", {{{"text", doc(90)}}, {{"text", doc(91)}}}}}.dump(2) + "\n");
  std::string noise;
  for (int i = 0; i < 5000; ++i) noise += char((i * 7919) % 251);
  dir.write_gz("in/201.jsonl.gz", noise);                               // binary: no line is JSON
  dir.write("in/202.jsonl.gz", "\x1f\x8b\x08\x00 not gzip after all");  // a damaged gzip header
  {
    // A gzip stream cut short: plain text is one document here, so nothing of it is kept.
    dir.write_gz("in/203.txt.gz", doc(95) + "\n" + doc(96));
    const std::string path = dir.path("in/203.txt.gz");
    fs::resize_file(path, fs::file_size(path) - 12);
  }
  PrepSettings s = byte_settings(dir, dir.path("in"));
  expect_bad_input([&] { run_prep(s); }, {"1 of 34 input files", "200.json.gz:1: ", "not JSON Lines"});
  EXPECT_EQ(names_in(dir.path("")), std::vector<std::string>{"in"});
  s.max_bad_files = {10, true};  // floor(34 * 0.1) = 3
  expect_bad_input([&] { run_prep(s); }, {"4 of 34 input files", "(3)", "203.txt.gz", "damaged or truncated"});
  s.max_bad_files = {4, false};
  const PrepResult r = run_prep(s);
  EXPECT_EQ(r.skipped.files, 4);
  EXPECT_EQ(r.skipped.lines, 0) << "the lines of a file that is not JSON Lines are not counted as lines";
  EXPECT_EQ(r.manifest.sources[0].documents, 30);
  ASSERT_EQ(r.skipped.named_files.size(), 4u);
  EXPECT_NE(r.skipped.named_files[2].find("202.jsonl.gz"), std::string::npos);
}

TEST(PrepFiles, BoundsParseAsCountsOrPercentages) {
  EXPECT_EQ(parse_input_bound("10", "--x").allowed(5), 10);
  EXPECT_EQ(parse_input_bound("0.1%", "--x").allowed(20000), 20);
  EXPECT_EQ(parse_input_bound("0.1%", "--x").allowed(999), 0);
  EXPECT_EQ(parse_input_bound("100%", "--x").allowed(7), 7);
  EXPECT_EQ(parse_input_bound("0", "--x").allowed(7), 0);
  for (const char* bad : {"", "-1", "1.5", "abc", "101%", "%", "nan", "1e300"})
    expect_bad_input([&] { parse_input_bound(bad, "--max-bad-files"); }, {"--max-bad-files", "a count"});
}

// ---- --out ---------------------------------------------------------------------------------------------

TEST(PrepOut, ATrailingSlashNamesTheDirectoryAndMissingParentsAreMade) {
  TempDir dir("prep_in");
  PrepSettings s = byte_settings(dir, dir.write("a.jsonl", line(1)));
  s.out = dir.path("out") + "//";
  run_prep(s);
  EXPECT_TRUE(fs::is_regular_file(dir.path("out/manifest.json")));
  s.out = dir.path("new/deeper/out/");
  run_prep(s);
  EXPECT_TRUE(fs::is_regular_file(dir.path("new/deeper/out/manifest.json")));
  // A preparation that fails removes the parents it made, and only those.
  dir.write("bad.jsonl", "{\"text\": 1}\n");
  s.inputs = {{"a", dir.path("bad.jsonl")}};
  s.out = dir.path("new/made/by/prep/out");
  expect_bad_input([&] { run_prep(s); }, {"bad.jsonl:1"});
  EXPECT_EQ(names_in(dir.path("new")), std::vector<std::string>{"deeper"});
}

TEST(PrepOut, AnythingThatExistsOrCannotBeMadeIsRefusedNamingOut) {
  TempDir dir("prep_in");
  PrepSettings s = byte_settings(dir, dir.write("a.jsonl", line(1)));
  fs::create_directory(dir.path("empty"));
  dir.write("full/keep", "mine");
  dir.write("file", "mine");
  fs::create_symlink(dir.path("nowhere"), dir.path("dangling"));
  fs::create_symlink("loop", dir.path("loop"));
  fs::create_symlink(dir.path("full"), dir.path("link_to_dir"));
  for (const auto& [out, needles] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"empty", {"exists (a directory)", "overwrites nothing"}},
           {"full/", {"exists (a directory)"}},
           {"file", {"exists (a file)"}},
           {"dangling", {"exists (a symbolic link)"}},
           {"loop", {"exists (a symbolic link)"}},
           {"link_to_dir/", {"exists"}},
           {"loop/out", {"cannot be used", "symbolic links"}},
           {"file/out", {"is a file, not a directory"}},
           {"file/deeper/out", {"is a file, not a directory"}},
           {".", {"expected the path of a new directory"}},
           {"full/..", {"expected the path of a new directory"}}}) {
    s.out = dir.path(out);
    std::vector<std::string> with_out = needles;
    with_out.push_back("--out");
    expect_bad_input([&] { run_prep(s); }, with_out);
  }
  s.out = "";
  expect_bad_input([&] { run_prep(s); }, {"--out ''"});
  EXPECT_EQ(fs::read_symlink(dir.path("dangling")), dir.path("nowhere"));
  EXPECT_EQ(names_in(dir.path("full")), std::vector<std::string>{"keep"});
  EXPECT_EQ(names_in(dir.path("empty")), std::vector<std::string>{});
}

TEST(PrepOut, ADirectoryInTheTemporaryNameIsNeitherRemovedNorUsed) {
  TempDir dir("prep_in");
  PrepSettings s = byte_settings(dir, dir.write("a.jsonl", line(1)));
  const std::string taken = dir.path("out.partial-" + std::to_string(::getpid()));
  dir.write("out.partial-" + std::to_string(::getpid()) + "/mine", "keep");
  run_prep(s);
  EXPECT_EQ(names_in(taken), std::vector<std::string>{"mine"});
  EXPECT_TRUE(fs::is_regular_file(dir.path("out/manifest.json")));
  EXPECT_EQ(names_in(dir.path("")),
            (std::vector<std::string>{"a.jsonl", "out", "out.partial-" + std::to_string(::getpid())}));
}

TEST(PrepOut, AnOutCreatedWhileRunningIsNotReplaced) {
  TempDir dir("prep_in");
  PrepSettings s = byte_settings(dir, dir.write("a.jsonl", line(1)));
  {
    OutputDir output(s.out);
    fs::create_directory(dir.path("out"));  // appears after the check, before the commit
    expect_bad_input([&] { output.commit(); }, {"--out", "was created while moe prep ran"});
  }
  EXPECT_EQ(names_in(dir.path("")), (std::vector<std::string>{"a.jsonl", "out"}));
  EXPECT_TRUE(fs::is_empty(dir.path("out")));
}

}  // namespace
}  // namespace moe::data
