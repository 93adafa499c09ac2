// `moe report`: what it may write and what it reads. --out replaces only a regular file that is a page the program
// wrote, never through a symbolic link, never another file of the run or sweep directory; the page goes through
// a fresh temporary file that no planted link can redirect. An input that is not a regular file (a FIFO, a
// directory, a link to /dev/zero) never blocks or is read: a whole-run input is refused with exit 2 naming it,
// a sweep cell's metrics.jsonl skips that cell (counted and named). Each refusal writes nothing.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <set>

#include "report_harness.h"

namespace moe {
namespace {
using namespace report_test;

// A run directory as the trainer leaves it (the files report must never replace), with two metrics lines.
fs::path make_run(const fs::path& dir) {
  const fs::path run = dir / "run";
  fs::create_directories(run);
  std::ofstream(run / "metrics.jsonl") << R"({"step":1,"loss":3,"lm_loss":3,"moe":[]})"
                                       << "\n"
                                       << R"({"step":2,"loss":2.5,"lm_loss":2.5,"moe":[]})"
                                       << "\n";
  std::ofstream(run / "config.json") << "{}";
  std::ofstream(run / "manifest.json") << R"({"config_hash":"abc"})";
  std::ofstream(run / "events.log") << "{}\n";
  return run;
}

std::set<std::string> names_in(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

// Something that is not a regular file at `at`: a FIFO, a directory, or a link to /dev/zero.
void plant(const fs::path& at, const std::string& kind) {
  if (kind == "fifo") {
    ASSERT_EQ(::mkfifo(at.c_str(), 0644), 0) << at;
  }
  if (kind == "dir") fs::create_directory(at);
  if (kind == "zero") fs::create_symlink("/dev/zero", at);
}

// Exit 2, the message names --out and the path, and `victim` keeps its bytes.
void expect_refused(const std::string& args, const fs::path& dir, const std::string& out, const fs::path& victim) {
  const std::string before = read_text_if_any(victim);
  EXPECT_EQ(moe_report(args, dir), 2) << args;
  const std::string err = read_text_if_any(dir / "report.stderr");
  EXPECT_NE(err.find("--out " + out), std::string::npos) << args << ": " << err;
  EXPECT_EQ(read_text_if_any(victim), before) << args << " changed " << victim;
}

TEST(ReportFiles, OutReplacesOnlyAPageItWroteAndNoOtherFileOfTheRun) {
  TempDir dir("report_out_rules");
  const fs::path run = make_run(dir.path()), other = dir.path() / "other";
  fs::create_directories(other / "sub");
  for (const char* name : {"metrics.jsonl", "config.json", "manifest.json", "events.log"})
    expect_refused(quoted(run.string()) + " --out " + quoted((run / name).string()), dir.path(), (run / name).string(),
                   run / name);
  // A new file inside the run, beside the report, is not the report either.
  expect_refused(quoted(run.string()) + " --out " + quoted((run / "notes.html").string()), dir.path(),
                 (run / "notes.html").string(), run / "notes.html");
  EXPECT_FALSE(fs::exists(run / "notes.html"));
  // Outside the run: a user's file that is not a page, a directory, a FIFO, a name ending in a slash.
  std::ofstream(other / "notes.html") << "<html>my notes</html>";
  expect_refused(quoted(run.string()) + " --out " + quoted((other / "notes.html").string()), dir.path(),
                 (other / "notes.html").string(), other / "notes.html");
  expect_refused(quoted(run.string()) + " --out " + quoted((other / "sub").string()), dir.path(),
                 (other / "sub").string(), other / "notes.html");
  ASSERT_EQ(::mkfifo((other / "fifo.html").c_str(), 0644), 0);
  expect_refused(quoted(run.string()) + " --out " + quoted((other / "fifo.html").string()), dir.path(),
                 (other / "fifo.html").string(), other / "notes.html");
  expect_refused(quoted(run.string()) + " --out " + quoted((other / "sub").string() + "/"), dir.path(),
                 (other / "sub").string() + "/", other / "notes.html");
  // A file whose content merely mentions the mark somewhere is not a page either.
  std::ofstream(other / "quote.html") << "x <meta name=\"generator\" content=\"moe report\">";
  expect_refused(quoted(run.string()) + " --out " + quoted((other / "quote.html").string()), dir.path(),
                 (other / "quote.html").string(), other / "quote.html");
  EXPECT_EQ(names_in(run), (std::set<std::string>{"metrics.jsonl", "config.json", "manifest.json", "events.log"}));

  // Its own pages are replaced: the default PATH/report.html and a page outside, each twice.
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(moe_report(quoted(run.string()), dir.path()), 0) << read_text_if_any(dir.path() / "report.stderr");
    EXPECT_EQ(moe_report(quoted(run.string()) + " --out " + quoted((other / "page.html").string()), dir.path()), 0);
  }
  EXPECT_EQ(names_in(run),
            (std::set<std::string>{"metrics.jsonl", "config.json", "manifest.json", "events.log", "report.html"}));
  EXPECT_EQ(names_in(other), (std::set<std::string>{"sub", "notes.html", "fifo.html", "quote.html", "page.html"}))
      << "a temporary file was left";
  EXPECT_EQ(read_text(run / "report.html").rfind("<!DOCTYPE html>", 0), 0u);
}

TEST(ReportFiles, OutInsideASweepIsOnlyItsReport) {
  TempDir dir("report_out_sweep");
  const fs::path sweep = dir.path() / "sw", cell = sweep / "cells" / "000";
  fs::create_directories(cell);
  std::ofstream(cell / "metrics.jsonl") << R"({"step":1,"lm_loss":2})"
                                        << "\n";
  std::ofstream(sweep / "sweep.json") << R"({"grid":[],"cells":[{"name":"000","run_dir":"cells/000"}],"summary":[]})";
  for (const fs::path& target : {sweep / "sweep.json", cell / "metrics.jsonl", cell / "report.html", sweep / "x.html"})
    expect_refused(quoted(sweep.string()) + " --out " + quoted(target.string()), dir.path(), target.string(), target);
  EXPECT_FALSE(fs::exists(cell / "report.html"));
  EXPECT_EQ(moe_report(quoted(sweep.string()), dir.path()), 0) << read_text_if_any(dir.path() / "report.stderr");
  EXPECT_TRUE(fs::is_regular_file(sweep / "report.html"));
}

TEST(ReportFiles, APlantedLinkNeverRedirectsTheWrite) {
  TempDir dir("report_out_links");
  const fs::path run = make_run(dir.path()), victim = dir.path() / "victim.txt";
  std::ofstream(victim) << "precious";
  // A link at the target: refused, even one to a page of its own; the link stays a link.
  fs::create_symlink(victim, run / "report.html");
  expect_refused(quoted(run.string()), dir.path(), (run / "report.html").string(), victim);
  EXPECT_TRUE(fs::is_symlink(run / "report.html"));
  fs::remove(run / "report.html");
  ASSERT_EQ(moe_report(quoted(run.string()) + " --out " + quoted((dir.path() / "mine.html").string()), dir.path()), 0);
  fs::create_symlink(dir.path() / "mine.html", dir.path() / "link.html");
  expect_refused(quoted(run.string()) + " --out " + quoted((dir.path() / "link.html").string()), dir.path(),
                 (dir.path() / "link.html").string(), dir.path() / "mine.html");
  // A dangling link: nothing is created where it points.
  fs::create_symlink(dir.path() / "created.html", dir.path() / "dangling.html");
  expect_refused(quoted(run.string()) + " --out " + quoted((dir.path() / "dangling.html").string()), dir.path(),
                 (dir.path() / "dangling.html").string(), victim);
  EXPECT_FALSE(fs::exists(dir.path() / "created.html"));
  // Links at the temporary names an earlier version used, and at the dot-named ones: the page is written and
  // none of them is followed.
  for (const char* name : {"report.html.tmp", ".report.html.tmp", ".report.html"})
    fs::create_symlink(victim, run / name);
  EXPECT_EQ(moe_report(quoted(run.string()), dir.path()), 0) << read_text_if_any(dir.path() / "report.stderr");
  EXPECT_EQ(read_text(victim), "precious");
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(run / "report.html")));
  for (const char* name : {"report.html.tmp", ".report.html.tmp", ".report.html"})
    EXPECT_TRUE(fs::is_symlink(run / name)) << name;
}

// Exit 2 naming `file`, at once (a FIFO never blocks), and no page written.
void expect_input_refused(const fs::path& path, const fs::path& dir, const std::string& file) {
  EXPECT_EQ(moe_report(quoted(path.string()), dir), 2) << file;
  const std::string err = read_text_if_any(dir / "report.stderr");
  EXPECT_NE(err.find(file), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(path / "report.html")) << file;
}

TEST(ReportFiles, ARunInputThatIsNotARegularFileIsRefusedWithoutBlocking) {
  TempDir dir("report_inputs");
  const fs::path run = make_run(dir.path());
  fs::remove(run / "metrics.jsonl");
  ASSERT_EQ(::mkfifo((run / "metrics.jsonl").c_str(), 0644), 0);
  expect_input_refused(run, dir.path(), "metrics.jsonl");
  EXPECT_NE(read_text_if_any(dir.path() / "report.stderr").find("FIFO"), std::string::npos);
  fs::remove(run / "metrics.jsonl");
  fs::create_symlink("/dev/zero", run / "metrics.jsonl");
  expect_input_refused(run, dir.path(), "metrics.jsonl");
  fs::remove(run / "metrics.jsonl");
  fs::create_directory(run / "metrics.jsonl");
  expect_input_refused(run, dir.path(), "metrics.jsonl");
  fs::remove(run / "metrics.jsonl");
  std::ofstream(run / "metrics.jsonl") << R"({"step":1,"loss":3,"lm_loss":3,"moe":[]})"
                                       << "\n";
  for (const char* kind : {"fifo", "dir", "zero"}) {
    fs::remove(run / "manifest.json");
    plant(run / "manifest.json", kind);
    expect_input_refused(run, dir.path(), "manifest.json");
  }
  fs::remove(run / "manifest.json");
  // config.json is not read: a FIFO there does not block the report.
  fs::remove(run / "config.json");
  ASSERT_EQ(::mkfifo((run / "config.json").c_str(), 0644), 0);
  EXPECT_EQ(moe_report(quoted(run.string()), dir.path()), 0) << read_text_if_any(dir.path() / "report.stderr");
}

TEST(ReportFiles, ASweepJsonThatIsNotARegularFileIsRefusedAndABadCellIsSkipped) {
  TempDir dir("report_sweep_inputs");
  const fs::path sweep = dir.path() / "sw", outside = dir.path() / "outside";
  fs::create_directories(outside);
  std::ofstream(outside / "metrics.jsonl") << R"({"step":1,"lm_loss":99})"
                                           << "\n";
  json cells = json::array();
  for (const std::string name : {"good", "fifo", "zero", "dir", "linked", "up", "abs", "number"}) {
    fs::create_directories(sweep / "cells");
    json cell = {{"name", name}, {"run_dir", "cells/" + name}, {"params", json::object()}, {"status", "done"}};
    if (name == "linked") fs::create_directory_symlink(outside, sweep / "cells" / name);
    if (name == "up") cell["run_dir"] = "cells/../../outside";
    if (name == "abs") cell["run_dir"] = outside.string();
    if (name == "number") cell["run_dir"] = 7;
    if (name == "good" || name == "fifo" || name == "zero" || name == "dir")
      fs::create_directories(sweep / "cells" / name);
    if (name == "good")
      std::ofstream(sweep / "cells" / name / "metrics.jsonl") << R"({"step":1,"lm_loss":2})"
                                                              << "\n";
    if (name == "fifo" || name == "zero" || name == "dir") plant(sweep / "cells" / name / "metrics.jsonl", name);
    cells.push_back(cell);
  }
  std::ofstream(sweep / "sweep.json") << json{{"grid", json::array()}, {"cells", cells}, {"summary", json::array()}};
  ASSERT_EQ(moe_report(quoted(sweep.string()), dir.path()), 0) << read_text_if_any(dir.path() / "report.stderr");
  const std::string err = read_text_if_any(dir.path() / "report.stderr");
  EXPECT_NE(err.find("7 cells whose metrics.jsonl could not be read"), std::string::npos) << err;
  EXPECT_NE(err.find("cell \"fifo\""), std::string::npos) << err;
  const json data = embedded_data(read_text(sweep / "report.html"));
  EXPECT_EQ(data["skipped"]["cells"], 7);
  ASSERT_EQ(data["charts"]["chart-cells-loss"]["series"].size(), 1u) << "only the good cell is drawn";
  EXPECT_EQ(data["charts"]["chart-cells-loss"]["series"][0]["y"], json({2.0}));
  // sweep.json itself: a FIFO, a directory, a link to /dev/zero are refused.
  fs::remove(sweep / "report.html");
  for (const char* kind : {"fifo", "dir", "zero"}) {
    fs::remove(sweep / "sweep.json");
    plant(sweep / "sweep.json", kind);
    expect_input_refused(sweep, dir.path(), "sweep.json");
  }
  // A sweep.json of another shape: refused naming the field.
  fs::remove(sweep / "sweep.json");
  for (const char* doc :
       {R"([])", R"({"grid":{},"cells":[],"summary":[]})", R"({"grid":[{"key":1}],"cells":[],"summary":[]})"}) {
    std::ofstream(sweep / "sweep.json") << doc;
    expect_input_refused(sweep, dir.path(), "sweep.json");
  }
}

}  // namespace
}  // namespace moe
