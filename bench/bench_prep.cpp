// bench_prep: throughput of `moe prep` (tokenization, deduplication, quality scoring, shard writing) on a
// generated corpus of --mb megabytes, beside the time to simply read the same bytes (the I/O bound), and
// the peak resident memory of `moe train` on the prepared shards against the corpus size. The corpus is
// JSON Lines of Zipf-distributed words, with 5% exact and 5% near duplicates planted. Prints
// human-readable lines, then one line of JSON with every figure. It measures; it asserts nothing (the ctest
// entry runs --quick and checks the exit code).
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_main.h"
#include "data/prep.h"
#include "data/prep_input.h"

namespace moe::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Options {
  double mb = 256;
  int threads = 0;  // 0: every core
  int64_t vocab = 32768;
  int train_steps = 20;
  std::string dir;  // default: a fresh directory under the system's temporary directory
  std::string moe;  // default: `moe` beside this program
  bool quick = false;
  bool keep = false;
};

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Peak resident memory of this process so far, in MB (VmHWM).
double peak_rss_mb() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return 0;
}

// A JSON Lines corpus of about `bytes`, in files of 64 MB: documents of 150..1000 Zipf-distributed words
// from a vocabulary of 20,000 pseudo-words; 5% exact copies and 5% copies with 3 words changed.
int64_t generate_corpus(const fs::path& dir, int64_t bytes) {
  std::mt19937_64 rng(2024);
  std::vector<std::string> words;
  for (int i = 0; i < 20000; ++i) {
    std::string w;
    for (int k = 0, n = 2 + int(rng() % 8); k < n; ++k) w += char('a' + (rng() % 26));
    words.push_back(w);
  }
  std::vector<double> cumulative;
  double total = 0;
  for (int i = 0; i < 20000; ++i) cumulative.push_back(total += 1.0 / (i + 1));
  auto word = [&] {
    const double u = std::uniform_real_distribution<double>(0, total)(rng);
    return words[size_t(std::lower_bound(cumulative.begin(), cumulative.end(), u) - cumulative.begin())];
  };
  fs::create_directories(dir);
  std::ofstream out;
  int64_t written = 0, file_bytes = 0, files = 0;
  std::vector<std::string> recent;
  while (written < bytes) {
    if (!out.is_open() || file_bytes > (int64_t(64) << 20)) {
      out = std::ofstream(dir / ("part-" + std::to_string(files++) + ".jsonl"));
      file_bytes = 0;
    }
    std::string text;
    const uint64_t kind = rng() % 20;
    if (kind == 0 && !recent.empty()) {
      text = recent[rng() % recent.size()];
    } else if (kind == 1 && !recent.empty()) {
      std::vector<std::string> w;
      std::istringstream in(recent[rng() % recent.size()]);
      for (std::string x; in >> x;) w.push_back(x);
      for (int k = 0; k < 3; ++k) w[rng() % w.size()] = word();
      for (const std::string& x : w) text += (text.empty() ? "" : " ") + x;
    } else {
      for (int i = 0, n = 150 + int(rng() % 850); i < n; ++i) text += (i ? (i % 17 == 16 ? ".\n" : " ") : "") + word();
      if (recent.size() < 1000)
        recent.push_back(text);
      else
        recent[rng() % recent.size()] = text;
    }
    const std::string line = nlohmann::json{{"text", text}}.dump() + "\n";
    out << line;
    written += int64_t(line.size()), file_bytes += int64_t(line.size());
  }
  return written;
}

// Reads every file once with read() in 1 MB pieces, and once through the JSON Lines reader: the I/O bound
// and the parse bound of prep's input, in seconds.
std::pair<double, double> read_bounds(const fs::path& dir) {
  const std::vector<std::string> files = data::list_input_files(dir.string());
  auto t0 = Clock::now();
  std::vector<char> buffer(size_t(1) << 20);
  for (const std::string& f : files) {
    std::ifstream in(f, std::ios::binary);
    while (in.read(buffer.data(), std::streamsize(buffer.size())) || in.gcount() > 0) {
    }
  }
  const double raw = seconds_since(t0);
  t0 = Clock::now();
  std::string doc;
  for (const std::string& f : files) {
    data::DocumentReader reader(f, int64_t(1) << 20);
    while (reader.next(doc)) {
    }
  }
  return {raw, seconds_since(t0)};
}

// Runs `moe train` on the prepared directory in a child process; returns its peak resident memory in MB.
double train_peak_rss_mb(const Options& o, const fs::path& prepared, int64_t vocab, const fs::path& run_dir) {
  const std::string sources = R"(data.sources=[{"name": "corpus", "path": ")" + prepared.string() + "\"}]";
  const std::vector<std::string> args = {o.moe,       "train",
                                         "--config",  std::string(MOE_SOURCE_DIR) + "/configs/tiny.json",
                                         "--set",     sources,
                                         "--set",     "model.vocab=" + std::to_string(vocab),
                                         "--set",     "train.steps=" + std::to_string(o.train_steps),
                                         "--set",     "train.eval_every=0",
                                         "--set",     "train.threads=1",
                                         "--run-dir", run_dir.string(),
                                         "--quiet"};
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  int status = 0;
  struct rusage usage {};
  ::wait4(pid, &status, 0, &usage);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error("moe train on the prepared data failed (exit " + std::to_string(WEXITSTATUS(status)) +
                             ")");
  return double(usage.ru_maxrss) / 1024.0;
}

void run(Options o) {
  if (o.quick) o.mb = 4, o.vocab = 2048, o.train_steps = 2;
  if (o.threads <= 0) o.threads = int(std::max(1u, std::thread::hardware_concurrency()));
  if (o.moe.empty()) o.moe = (fs::read_symlink("/proc/self/exe").parent_path() / "moe").string();
  const fs::path root =
      o.dir.empty() ? fs::temp_directory_path() / ("moe_bench_prep_" + std::to_string(::getpid())) : fs::path(o.dir);
  fs::remove_all(root);
  const int64_t bytes = generate_corpus(root / "input", int64_t(o.mb * 1e6));
  const auto [read_s, parse_s] = read_bounds(root / "input");

  data::PrepSettings s;
  s.inputs = {{"corpus", (root / "input").string()}};
  s.out = (root / "prepared").string();
  s.vocab = o.vocab;
  s.threads = o.threads;
  s.tokenizer_sample_bytes = std::min<int64_t>(bytes, int64_t(32) << 20);
  const data::PrepResult r = data::run_prep(s);
  const double prep_rss = peak_rss_mb();
  const data::PreparedSourceInfo& src = r.manifest.sources.at(0);
  const double train_rss = train_peak_rss_mb(o, root / "prepared", r.manifest.tokenizer.vocab, root / "run");
  // The same model on a 2 MB corpus prepared with the same tokenizer: what training needs whatever the data.
  generate_corpus(root / "small_input", int64_t(2e6));
  data::PrepSettings small = s;
  small.inputs = {{"corpus", (root / "small_input").string()}};
  small.out = (root / "small_prepared").string();
  small.tokenizer = (root / "prepared" / "tokenizer.bpe").string();
  data::run_prep(small);
  const double baseline_rss =
      train_peak_rss_mb(o, root / "small_prepared", r.manifest.tokenizer.vocab, root / "small_run");

  const double mb = double(bytes) / 1e6;
  const data::PrepTimings& t = r.timings;
  auto per_core = [&](double cpu_s) { return cpu_s > 0 ? mb / cpu_s : 0.0; };
  std::printf("bench_prep: %.0f MB of JSON Lines (%lld documents), %d worker threads, vocab %lld\n", mb,
              static_cast<long long>(src.documents_in), o.threads, static_cast<long long>(r.manifest.tokenizer.vocab));
  std::printf("  I/O bound: read() %.1f MB/s; JSON Lines reader %.1f MB/s\n", mb / read_s, mb / parse_s);
  std::printf("  prep wall: %.1f s = %.1f MB/s (reading alone is %.0fx faster)\n", t.wall, mb / t.wall,
              t.wall / read_s);
  std::printf(
      "  per core: tokenizer training %.1f s on %.0f MB; tokenize %.1f MB/s, dedup signature %.1f MB/s, "
      "dedup decisions %.1f MB/s, quality %.1f MB/s, shard writing %.1f MB/s, reading %.1f MB/s\n",
      t.tokenizer_training, double(s.tokenizer_sample_bytes) / 1e6, per_core(t.tokenize), per_core(t.signature),
      per_core(t.dedup), per_core(t.quality), per_core(t.write), per_core(t.read));
  std::printf("  removed: %lld exact, %lld near duplicates (planted about 5%% each); %.2f bytes a token\n",
              static_cast<long long>(src.removed.exact), static_cast<long long>(src.removed.near),
              double(src.bytes_in) / double(src.tokens));
  std::printf(
      "  peak resident memory: prep %.0f MB; moe train %.0f MB on these shards (%.0f MB of tokens) against "
      "%.0f MB on a 2 MB corpus with the same model: %+.0f MB for %.0f MB more corpus\n",
      prep_rss, train_rss, double(src.tokens * r.manifest.token_bytes) / 1e6, baseline_rss, train_rss - baseline_rss,
      mb - 2.0);
  const nlohmann::json figures = {{"mb", mb},
                                  {"threads", o.threads},
                                  {"read_mb_s", mb / read_s},
                                  {"parse_mb_s", mb / parse_s},
                                  {"prep_mb_s", mb / t.wall},
                                  {"tokenizer_training_s", t.tokenizer_training},
                                  {"tokenize_mb_s_core", per_core(t.tokenize)},
                                  {"signature_mb_s_core", per_core(t.signature)},
                                  {"dedup_mb_s_core", per_core(t.dedup)},
                                  {"quality_mb_s_core", per_core(t.quality)},
                                  {"write_mb_s_core", per_core(t.write)},
                                  {"removed_exact", src.removed.exact},
                                  {"removed_near", src.removed.near},
                                  {"prep_peak_rss_mb", prep_rss},
                                  {"train_peak_rss_mb", train_rss},
                                  {"train_baseline_peak_rss_mb", baseline_rss}};
  std::printf("%s\n", figures.dump().c_str());
  if (!o.keep) fs::remove_all(root);
}

}  // namespace
}  // namespace moe::bench

int main(int argc, char** argv) {
  moe::bench::Options o;
  CLI::App app{"bench_prep: moe prep throughput per stage against the read bound, and moe train's memory on shards"};
  app.add_option("--mb", o.mb, "Megabytes of corpus to generate and prepare")->default_val(256);
  app.add_option("--threads", o.threads, "Worker threads of prep (0: every core)")->default_val(0);
  app.add_option("--vocab", o.vocab, "BPE vocabulary")->default_val(32768);
  app.add_option("--train-steps", o.train_steps, "Steps of moe train on the prepared data")->default_val(20);
  app.add_option("--dir", o.dir, "Working directory (default: a fresh one under the temporary directory)");
  app.add_option("--moe", o.moe, "The moe program (default: beside this one)");
  app.add_flag("--quick", o.quick, "4 MB, vocab 2048, 2 training steps: a smoke check");
  app.add_flag("--keep", o.keep, "Keep the generated corpus and the prepared directory");
  return moe::bench::parse_and_run(app, argc, argv, "bench_prep", [&] { moe::bench::run(o); });
}
