// `moe prep` (see prep_command.h).
#include "launch/commands/prep_command.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "launch/run/progress.h"

namespace moe {
namespace {

// "1,0.7" -> {1, 0.7}; BadInput naming the option otherwise.
std::vector<double> parse_numbers(const std::string& text, const char* option) {
  std::vector<double> values;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size())
      MOE_BAD_INPUT(option << " " << text << ": '" << item << "' is not a number; expected a comma-separated list");
    values.push_back(v);
  }
  return values;
}

// NAME=PATH, or PATH whose source is named after its file (without extensions) or directory.
data::PrepInput parse_input(const std::string& text) {
  const size_t eq = text.find('=');
  if (eq != std::string::npos && text.find('/') > eq) return {text.substr(0, eq), text.substr(eq + 1)};
  std::string name = text;
  while (!name.empty() && name.back() == '/') name.pop_back();
  name = name.substr(name.rfind('/') == std::string::npos ? 0 : name.rfind('/') + 1);
  if (name.find('.') != std::string::npos && name.find('.') > 0) name = name.substr(0, name.find('.'));
  return {name, text};
}

// One progress line: percentage, bytes/s and the estimated time left; in place on a terminal.
class PrepProgressLine {
 public:
  explicit PrepProgressLine(bool enabled) : enabled_(enabled), tty_(::isatty(STDERR_FILENO)) {}
  void show(const data::PrepProgress& p) {
    if (!enabled_) return;
    if (!tty_ && p.seconds - last_ < 10.0 && p.bytes_done < p.bytes_total) return;
    if (tty_ && p.seconds - last_ < 0.2 && p.bytes_done < p.bytes_total) return;
    last_ = p.seconds;
    const double fraction = p.bytes_total > 0 ? double(p.bytes_done) / double(p.bytes_total) : 1.0;
    const double rate = p.seconds > 0 ? double(p.bytes_done) / p.seconds : 0.0;
    const double eta = rate > 0 ? double(p.bytes_total - p.bytes_done) / rate : 0.0;
    constexpr int kWidth = 30;
    const int filled = int(fraction * kWidth);
    std::fprintf(stderr, "%s[%s%s] %5.1f%% %8.1f MB/s  %lld documents  ETA %s%s", tty_ ? "\r" : "",
                 std::string(size_t(filled), '#').c_str(), std::string(size_t(kWidth - filled), '.').c_str(),
                 100.0 * fraction, rate / 1e6, static_cast<long long>(p.documents), format_duration(eta).c_str(),
                 tty_ ? "   " : "\n");
    std::fflush(stderr);
    open_ = tty_;
  }
  void end() {
    if (open_) std::fprintf(stderr, "\n");
    open_ = false;
  }

 private:
  bool enabled_, tty_, open_ = false;
  double last_ = -1e9;
};

// "N files skipped: A; B; and K more" for what prep could not read, or nothing when nothing was skipped.
void print_skipped(const char* what, int64_t count, int64_t total, const std::vector<std::string>& named) {
  if (count == 0) return;
  std::printf("  skipped %lld of %lld %s:", static_cast<long long>(count), static_cast<long long>(total), what);
  for (const std::string& note : named) std::printf("\n    %s", note.c_str());
  if (count > int64_t(named.size()))
    std::printf("\n    and %lld more", static_cast<long long>(count - int64_t(named.size())));
  std::printf("\n");
}

void print_summary(const data::PrepResult& r, const std::string& out_dir) {
  const data::PrepManifest& m = r.manifest;
  std::printf("moe prep: %s written in %.1f s: tokenizer %s (vocab %lld, xxh64 %s), manifest xxh64 %s\n",
              out_dir.c_str(), r.timings.wall, m.tokenizer.kind.c_str(), static_cast<long long>(m.tokenizer.vocab),
              data::hex64(m.tokenizer.xxh64).c_str(), data::hex64(r.manifest_xxh64).c_str());
  for (const data::PreparedSourceInfo& s : m.sources) {
    std::printf(
        "  %s: %lld documents in (%.1f MB), %lld kept, %lld tokens (%.2f bytes a token); removed: %lld exact, "
        "%lld near duplicates, %lld low quality, %lld empty; tiers:",
        s.name.c_str(), static_cast<long long>(s.documents_in), double(s.bytes_in) / 1e6,
        static_cast<long long>(s.documents), static_cast<long long>(s.tokens),
        s.tokens > 0 ? double(s.bytes_in) / double(s.tokens) : 0.0, static_cast<long long>(s.removed.exact),
        static_cast<long long>(s.removed.near), static_cast<long long>(s.removed.quality),
        static_cast<long long>(s.removed.empty));
    for (const data::SegmentInfo& seg : s.segments)
      std::printf(" %d: %lld documents (weight %g)", seg.tier, static_cast<long long>(seg.documents), seg.weight);
    std::printf("\n");
  }
  print_skipped("input files (unreadable)", r.skipped.files, r.files_total, r.skipped.named_files);
  print_skipped("JSON Lines lines (malformed or too long)", r.skipped.lines, r.lines_total, r.skipped.named_lines);
}

}  // namespace

CLI::App* add_prep_command(CLI::App& app, PrepOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "prep",
      "Prepare a corpus once: tokenize (byte-level BPE), drop exact and near duplicates, score quality into tiers, "
      "and write token shards that data.sources[].path can name (docs/data.md).");
  data::PrepSettings& s = o.settings;
  cmd->add_option("--input", o.inputs,
                  "[NAME=]PATH: a text file, a JSON Lines file (.jsonl, \"text\" field), either gzipped or not, or a "
                  "directory of them; each --input is one source, named NAME or after the file (repeatable)")
      ->required();
  cmd->add_option("--out", s.out, "The directory to write; must not exist")->required();
  cmd->add_option("--tokenizer", s.tokenizer,
                  "train: learn a byte-level BPE on a sample of the inputs; byte: bytes only; or a tokenizer file "
                  "(tokenizer.bpe of an earlier prep)")
      ->default_val("train");
  cmd->add_option("--vocab", s.vocab,
                  "With --tokenizer train: the vocabulary size (bytes and end-of-document included)")
      ->default_val(32768);
  cmd->add_option("--tokenizer-sample-mb", o.tokenizer_sample_mb,
                  "With --tokenizer train: MB of text the tokenizer learns from, taken evenly from the inputs' starts")
      ->default_val(32);
  cmd->add_option("--threads", s.threads, "Worker threads (default: every core)")
      ->default_val(std::max(1u, std::thread::hardware_concurrency()));
  cmd->add_option("--jaccard", s.dedup.threshold,
                  "Near-duplicate threshold: documents whose estimated Jaccard similarity (word 5-gram shingles) with "
                  "an earlier document reaches this are removed")
      ->default_val(0.8);
  cmd->add_option("--shingle", s.dedup.shingle_words, "Words per shingle for near-duplicate detection")->default_val(5);
  cmd->add_flag("--no-exact-dedup", o.no_exact, "Keep exact duplicates");
  cmd->add_flag("--no-near-dedup", o.no_near, "Keep near duplicates");
  cmd->add_flag("--no-quality", o.no_quality, "Put every document in tier 0 (no quality scoring)");
  cmd->add_option("--tier-thresholds", o.tier_thresholds,
                  "Quality score (share of the rules passed) each tier starts at, best first; one tier more than "
                  "thresholds")
      ->default_val("1,0.7");
  cmd->add_option("--tier-weights", o.tier_weights, "Sampling weight of each tier, best first")
      ->default_val("1,0.5,0.1");
  cmd->add_flag("--drop-lowest-tier", s.drop_lowest_tier, "Remove the lowest tier's documents instead of keeping them");
  cmd->add_option("--shard-tokens", s.shard_tokens, "Tokens per shard file")->default_val(int64_t(1) << 27);
  cmd->add_option("--max-document-bytes", s.max_document_bytes,
                  "Plain text files are cut into documents of about this many bytes (at a line end)")
      ->default_val(int64_t(1) << 20);
  cmd->add_option("--max-line-bytes", s.max_line_bytes,
                  "A JSON Lines line longer than this is skipped (and counted) without being read whole")
      ->default_val(data::kDefaultMaxLineBytes);
  cmd->add_option("--max-bad-files", o.max_bad_files,
                  "Input files that cannot be read (not regular files, damaged gzip, not JSON Lines) are skipped "
                  "and counted up to this many: a count, or a percentage of the files; past it prep stops and "
                  "writes nothing")
      ->default_val("0.1%");
  cmd->add_option("--max-bad-lines", o.max_bad_lines,
                  "Malformed or too long JSON Lines lines are skipped and counted up to this many: a count, or a "
                  "percentage of the lines; past it prep stops and writes nothing")
      ->default_val("0.1%");
  cmd->add_flag("--quiet", o.quiet, "No progress bar");
  return cmd;
}

void run_prep_command(PrepOptions& o) {
  data::PrepSettings& s = o.settings;
  for (const std::string& text : o.inputs) s.inputs.push_back(parse_input(text));
  if (!(o.tokenizer_sample_mb > 0 && o.tokenizer_sample_mb < 1e6))
    MOE_BAD_INPUT("--tokenizer-sample-mb " << o.tokenizer_sample_mb << ": expected a number of MB > 0");
  s.tokenizer_sample_bytes = int64_t(o.tokenizer_sample_mb * 1e6);
  s.tier_thresholds = parse_numbers(o.tier_thresholds, "--tier-thresholds");
  s.tier_weights = parse_numbers(o.tier_weights, "--tier-weights");
  s.max_bad_files = data::parse_input_bound(o.max_bad_files, "--max-bad-files");
  s.max_bad_lines = data::parse_input_bound(o.max_bad_lines, "--max-bad-lines");
  s.dedup.exact = !o.no_exact;
  s.dedup.near = !o.no_near;
  s.quality = !o.no_quality;
  data::validate_prep_settings(s);
  PrepProgressLine line(!o.quiet);
  const data::PrepResult result = data::run_prep(s, [&](const data::PrepProgress& p) { line.show(p); });
  line.end();
  print_summary(result, s.out);
}

}  // namespace moe
