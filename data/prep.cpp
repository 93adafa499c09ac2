// The prep pipeline (see prep.h).
#include "data/prep.h"

#include <xxhash.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "core/error.h"
#include "data/bpe.h"
#include "data/file_io.h"
#include "data/prep_input.h"
#include "data/prep_output.h"
#include "data/quality.h"

namespace moe::data {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

constexpr size_t kBatchBytes = size_t(4) << 20;

// Documents of one source read together; the unit of work of the threads.
struct Batch {
  int64_t sequence = 0;
  size_t source = 0;
  std::vector<std::string> documents;
  int64_t bytes_done = 0;  // input bytes consumed when the batch was complete, for progress
};

// What the workers compute for each document of a batch.
struct Processed {
  DedupSignature signature;
  int32_t tier = 0;
  std::vector<int32_t> tokens;
  int64_t bytes = 0;
};

struct Tokenizer {
  std::string kind;  // "byte" | "bpe"
  BpeTokenizer bpe;
  std::string file_bytes;  // the tokenizer file ("" for byte)
};

bool valid_source_name(const std::string& name) {
  if (name.empty() || name == "." || name == "..") return false;
  for (const char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
          c == '.'))
      return false;
  return true;
}

void validate_tiers(const PrepSettings& s) {
  for (size_t t = 0; t < s.tier_thresholds.size(); ++t) {
    const double v = s.tier_thresholds[t];
    if (!(v >= 0 && v <= 1) || (t > 0 && v >= s.tier_thresholds[t - 1]))
      MOE_BAD_INPUT("--tier-thresholds: " << v << " at position " << t + 1
                                          << "; expected scores in [0, 1], strictly descending (e.g. 1,0.7)");
  }
  if (s.tier_weights.size() != s.tier_thresholds.size() + 1)
    MOE_BAD_INPUT("--tier-weights has " << s.tier_weights.size() << " weights; expected one per tier, "
                                        << s.tier_thresholds.size() + 1 << " (one more than --tier-thresholds)");
  for (const double w : s.tier_weights)
    if (!(w >= 0 && w < 1e12)) MOE_BAD_INPUT("--tier-weights: " << w << "; expected numbers >= 0");
  if (!(s.tier_weights[0] > 0)) MOE_BAD_INPUT("--tier-weights: the best tier's weight must be > 0");
}

// Largest tokenizer file read: a vocabulary of 2^20 merges takes a few tens of MB.
constexpr uint64_t kMaxTokenizerFileBytes = uint64_t(256) << 20;

Tokenizer load_tokenizer_file(const std::string& path) {
  const std::string who = "--tokenizer " + path + " (train, byte or a tokenizer file)";
  std::string text = read_regular_file(path, kMaxTokenizerFileBytes, who);
  Tokenizer t{"bpe", BpeTokenizer::parse(text, "--tokenizer " + path), std::move(text)};
  return t;
}

}  // namespace

void validate_prep_settings(const PrepSettings& s) {
  if (s.inputs.empty()) MOE_BAD_INPUT("no --input given; name at least one file or directory");
  std::set<std::string> names;
  for (const PrepInput& input : s.inputs) {
    if (!valid_source_name(input.name))
      MOE_BAD_INPUT("--input " << input.name << "=" << input.path << ": source name '" << input.name
                               << "' must be letters, digits, '_', '-' or '.' (write NAME=PATH to choose one)");
    if (!names.insert(input.name).second)
      MOE_BAD_INPUT("--input " << input.path << ": source name '" << input.name
                               << "' is used by another input too; write NAME=PATH to give each its own");
    list_input_files(input.path);
  }
  check_out_path(s.out);
  if (s.tokenizer != "train" && s.tokenizer != "byte") load_tokenizer_file(s.tokenizer);
  if (s.tokenizer == "train" && (s.vocab < kFirstMergeId || s.vocab > (int64_t(1) << 31) - 1))
    MOE_BAD_INPUT("--vocab " << s.vocab << ": expected an integer >= 257 (256 bytes and end-of-document) and < 2^31");
  if (s.tokenizer_sample_bytes < 1) MOE_BAD_INPUT("--tokenizer-sample-mb must be > 0");
  if (s.threads < 1) MOE_BAD_INPUT("--threads " << s.threads << ": expected an integer >= 1");
  if (!(s.dedup.threshold > 0 && s.dedup.threshold <= 1))
    MOE_BAD_INPUT("--jaccard " << s.dedup.threshold << ": expected a number in (0, 1]");
  if (s.dedup.shingle_words < 1 || s.dedup.shingle_words > 64)
    MOE_BAD_INPUT("--shingle " << s.dedup.shingle_words << ": expected an integer in [1, 64]");
  if (s.shard_tokens < 1) MOE_BAD_INPUT("--shard-tokens " << s.shard_tokens << ": expected an integer >= 1");
  if (s.max_document_bytes < 1) MOE_BAD_INPUT("--max-document-bytes: expected an integer >= 1");
  if (s.max_line_bytes < 1 || s.max_line_bytes > (int64_t(1) << 40))
    MOE_BAD_INPUT("--max-line-bytes " << s.max_line_bytes << ": expected an integer in [1, 2^40]");
  validate_tiers(s);
}

namespace {

// The sample the tokenizer learns from: the first documents of every input, an equal share of the bytes each.
Tokenizer train_tokenizer(const PrepSettings& s, const std::vector<std::vector<std::string>>& files) {
  std::vector<std::string> sample;
  const int64_t share = std::max<int64_t>(1, s.tokenizer_sample_bytes / int64_t(files.size()));
  for (const std::vector<std::string>& source_files : files) {
    int64_t taken = 0;
    for (size_t f = 0; f < source_files.size() && taken < share; ++f) {
      try {
        DocumentReader reader(source_files[f], s.max_document_bytes, s.max_line_bytes);
        std::string doc;
        while (taken < share && reader.next(doc)) {
          if (int64_t(doc.size()) > share - taken) doc.resize(size_t(share - taken));
          taken += int64_t(doc.size());
          sample.push_back(std::move(doc));
        }
      } catch (const Error& e) {
        // A file that cannot be read is counted (or refused) when the documents are read, not here.
        if (e.kind() != ErrorKind::BadInput) throw;
      }
    }
  }
  std::vector<std::string_view> views(sample.begin(), sample.end());
  Tokenizer t{"bpe", BpeTokenizer::train(views, s.vocab), ""};
  t.file_bytes = t.bpe.serialize();
  return t;
}

// The queue between the reader, the workers and the writer, and the failure of any of them.
struct Pipeline {
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<Batch> to_process;
  std::map<int64_t, std::pair<Batch, std::vector<Processed>>> done;  // by sequence
  int64_t read = 0, consumed = 0;
  bool reading_finished = false, failed = false;
  std::exception_ptr error;
  size_t max_in_flight = 4;

  void fail(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!failed) error = e;
    failed = true;
    changed.notify_all();
  }
};

struct Counters {
  std::mutex mutex;
  PrepTimings timings;
};

void push_batch(Pipeline& p, Batch& batch) {
  std::unique_lock<std::mutex> lock(p.mutex);
  p.changed.wait(lock, [&] { return p.failed || p.read - p.consumed < int64_t(p.max_in_flight); });
  if (p.failed) throw std::runtime_error("stopped");
  batch.sequence = p.read++;
  p.to_process.push_back(std::move(batch));
  p.changed.notify_all();
  batch = Batch{};
}

// What the reader skipped, overall and per source, and the totals the bounds are shares of.
struct InputTally {
  SkippedInputs all;
  std::vector<SkippedInputs> per_source;
  int64_t files_total = 0, lines_total = 0;
};

[[noreturn]] void too_many_skipped(const std::string& what, int64_t count, int64_t total, const InputBound& bound,
                                   const char* option, const std::vector<std::string>& named) {
  std::string list;
  for (const std::string& note : named) list += (list.empty() ? "" : "; ") + note;
  if (count > int64_t(named.size())) list += "; and " + std::to_string(count - int64_t(named.size())) + " more";
  MOE_BAD_INPUT(count << " of " << total << " " << what << " skipped, more than " << option << " " << bound.text()
                      << " allows (" << bound.allowed(total) << "): " << list
                      << ". Nothing was written: fix or remove them, or raise " << option
                      << " (a count, or a percentage such as 1%)");
}

// Stops the preparation once more was skipped than the bounds allow. A percentage of lines can only be
// judged once every line is read (`finished`); counts and files (whose total is known) at once.
void check_skipped(const PrepSettings& s, const InputTally& t, bool finished) {
  if (t.all.files > s.max_bad_files.allowed(t.files_total))
    too_many_skipped("input files could not be read and were", t.all.files, t.files_total, s.max_bad_files,
                     "--max-bad-files", t.all.named_files);
  if ((finished || !s.max_bad_lines.percent) && t.all.lines > s.max_bad_lines.allowed(t.lines_total))
    too_many_skipped("JSON Lines lines were", t.all.lines, t.lines_total, s.max_bad_lines, "--max-bad-lines",
                     t.all.named_lines);
}

void skip_file(InputTally& t, size_t source, const std::string& note) {
  t.all.add_file(note);
  t.per_source[source].add_file(note);
}

// Counts what a file read whole skipped. A JSON Lines file none of whose lines is a document is not JSON
// Lines at all (a JSON array, a binary file): one skipped file, not its lines.
void tally_file(InputTally& t, size_t source, const DocumentReader& reader) {
  const SkippedInputs& lines = reader.skipped();
  if (lines.lines > 0 && reader.documents() == 0)
    return skip_file(t, source, lines.named_lines.front() + " (and every other line: not JSON Lines)");
  t.lines_total += reader.lines();
  for (SkippedInputs* into : {&t.all, &t.per_source[source]}) {
    for (const std::string& note : lines.named_lines)
      if (into->named_lines.size() < SkippedInputs::kNamed) into->named_lines.push_back(note);
    into->lines += lines.lines;
  }
}

void read_inputs(Pipeline& p, const PrepSettings& s, const std::vector<std::vector<std::string>>& files,
                 InputTally& tally, Counters& counters) {
  double read_s = 0;
  int64_t bytes_before = 0;
  check_skipped(s, tally, false);  // the files that are not regular files, counted when listed
  for (size_t source = 0; source < files.size(); ++source) {
    Batch batch;
    batch.source = source;
    size_t batch_bytes = 0;
    for (const std::string& file : files[source]) {
      auto t0 = Clock::now();
      try {
        DocumentReader reader(file, s.max_document_bytes, s.max_line_bytes);
        std::string doc;
        while (reader.next(doc)) {
          read_s += seconds_since(t0);
          batch_bytes += doc.size();
          batch.documents.push_back(std::move(doc));
          if (batch_bytes >= kBatchBytes) {
            batch.bytes_done = bytes_before + reader.consumed();
            push_batch(p, batch);
            batch.source = source, batch_bytes = 0;
          }
          t0 = Clock::now();
        }
        tally_file(tally, source, reader);
      } catch (const Error& e) {
        // Unreadable or damaged: its documents read so far are kept, the rest skipped.
        if (e.kind() != ErrorKind::BadInput) throw;
        skip_file(tally, source, e.message());
      }
      check_skipped(s, tally, false);
      std::error_code ec;
      const uintmax_t size = fs::file_size(file, ec);
      if (!ec) bytes_before += int64_t(size);
    }
    batch.bytes_done = bytes_before;
    if (!batch.documents.empty()) push_batch(p, batch);
  }
  check_skipped(s, tally, true);
  std::lock_guard<std::mutex> lock(counters.mutex);
  counters.timings.read += read_s;
}

std::vector<Processed> process_batch(const Batch& batch, const PrepSettings& s, const Tokenizer& tokenizer,
                                     BpeEncoder& encoder, PrepTimings& t) {
  std::vector<Processed> out(batch.documents.size());
  for (size_t i = 0; i < batch.documents.size(); ++i) {
    const std::string& doc = batch.documents[i];
    Processed& r = out[i];
    r.bytes = int64_t(doc.size());
    auto t0 = Clock::now();
    r.signature = dedup_signature(doc, s.dedup);
    t.signature += seconds_since(t0);
    if (r.signature.empty) continue;
    t0 = Clock::now();
    if (s.quality) r.tier = quality_tier(quality_score(doc), s.tier_thresholds);
    t.quality += seconds_since(t0);
    t0 = Clock::now();
    if (tokenizer.bpe.merges().empty()) {
      r.tokens.assign(doc.begin(), doc.end());
      for (int32_t& v : r.tokens) v = int32_t(static_cast<unsigned char>(v));
    } else {
      encoder.encode(doc, r.tokens);
    }
    t.tokenize += seconds_since(t0);
  }
  return out;
}

void work(Pipeline& p, const PrepSettings& s, const Tokenizer& tokenizer, Counters& counters) {
  BpeEncoder encoder(tokenizer.bpe);
  PrepTimings mine;
  for (;;) {
    Batch batch;
    {
      std::unique_lock<std::mutex> lock(p.mutex);
      p.changed.wait(lock, [&] { return p.failed || !p.to_process.empty() || p.reading_finished; });
      if (p.failed || p.to_process.empty()) break;
      batch = std::move(p.to_process.front());
      p.to_process.pop_front();
    }
    std::vector<Processed> result = process_batch(batch, s, tokenizer, encoder, mine);
    batch.documents.clear();
    std::lock_guard<std::mutex> lock(p.mutex);
    const int64_t sequence = batch.sequence;
    p.done.emplace(sequence, std::make_pair(std::move(batch), std::move(result)));
    p.changed.notify_all();
  }
  std::lock_guard<std::mutex> lock(counters.mutex);
  counters.timings.signature += mine.signature;
  counters.timings.quality += mine.quality;
  counters.timings.tokenize += mine.tokenize;
}

}  // namespace

namespace {

// The thread that takes every decision in input order and writes what is kept.
struct Writer {
  const PrepSettings& settings;
  std::string dir;
  int32_t token_bytes;
  Deduplicator dedup;
  std::vector<PreparedSourceInfo> sources;
  std::map<std::pair<size_t, int32_t>, std::unique_ptr<ShardWriter>> shards;  // by (source, tier)
  std::map<std::pair<size_t, int32_t>, SegmentInfo> segments;
  PrepTimings timings;

  void take(size_t source, const Processed& doc) {
    PreparedSourceInfo& info = sources[source];
    ++info.documents_in;
    info.bytes_in += doc.bytes;
    if (doc.signature.empty) {
      ++info.removed.empty;
      return;
    }
    auto t0 = Clock::now();
    const DedupVerdict verdict = dedup.judge(doc.signature);
    timings.dedup += seconds_since(t0);
    if (verdict == DedupVerdict::Exact) return void(++info.removed.exact);
    if (verdict == DedupVerdict::Near) return void(++info.removed.near);
    const int32_t lowest = int32_t(settings.tier_thresholds.size());
    if (settings.drop_lowest_tier && doc.tier == lowest) return void(++info.removed.quality);
    t0 = Clock::now();
    const auto key = std::make_pair(source, doc.tier);
    std::unique_ptr<ShardWriter>& writer = shards[key];
    if (!writer)
      writer = std::make_unique<ShardWriter>(dir, info.name + ".t" + std::to_string(doc.tier), token_bytes,
                                             settings.shard_tokens);
    writer->append_document(doc.tokens.data(), int64_t(doc.tokens.size()), kEndOfDocument);
    SegmentInfo& seg = segments[key];
    seg.tier = doc.tier;
    seg.weight = settings.tier_weights[size_t(doc.tier)];
    seg.tokens += int64_t(doc.tokens.size()) + 1;
    seg.documents += 1;
    info.documents += 1;
    info.tokens += int64_t(doc.tokens.size()) + 1;
    timings.write += seconds_since(t0);
  }

  void finish() {
    for (auto& [key, writer] : shards) {
      SegmentInfo& seg = segments[key];
      seg.shards = writer->finish();
      sources[key.first].segments.push_back(seg);  // the map's order: by source, then tier, best first
    }
  }
};

void consume(Pipeline& p, Writer& writer, const PrepSettings& s, int64_t bytes_total,
             const std::function<void(const PrepProgress&)>& progress, Clock::time_point start) {
  PrepProgress shown;
  shown.bytes_total = bytes_total;
  for (;;) {
    std::pair<Batch, std::vector<Processed>> next;
    {
      std::unique_lock<std::mutex> lock(p.mutex);
      p.changed.wait(
          lock, [&] { return p.failed || p.done.count(p.consumed) || (p.reading_finished && p.consumed == p.read); });
      if (p.failed || !p.done.count(p.consumed)) return;
      next = std::move(p.done.at(p.consumed));
      p.done.erase(p.consumed);
      ++p.consumed;
      p.changed.notify_all();
    }
    for (const Processed& doc : next.second) writer.take(next.first.source, doc);
    shown.documents += int64_t(next.second.size());
    shown.bytes_done = next.first.bytes_done;
    shown.seconds = seconds_since(start);
    if (progress) progress(shown);
  }
}

// Reader, workers and writer over the inputs; rethrows the first failure of any of them.
void run_pipeline(const PrepSettings& s, const std::vector<std::vector<std::string>>& files, const Tokenizer& tokenizer,
                  Writer& writer, InputTally& tally, Counters& counters,
                  const std::function<void(const PrepProgress&)>& progress) {
  Pipeline p;
  p.max_in_flight = size_t(2 * s.threads + 2);
  int64_t bytes_total = 0;
  std::error_code ec;
  for (const auto& source_files : files)
    for (const std::string& f : source_files) {
      const uintmax_t size = fs::file_size(f, ec);
      if (!ec) bytes_total += int64_t(size);
    }
  const Clock::time_point start = Clock::now();
  std::thread reader([&] {
    try {
      read_inputs(p, s, files, tally, counters);
      std::lock_guard<std::mutex> lock(p.mutex);
      p.reading_finished = true;
      p.changed.notify_all();
    } catch (...) {
      p.fail(std::current_exception());
    }
  });
  std::vector<std::thread> workers;
  for (int i = 0; i < s.threads; ++i)
    workers.emplace_back([&] {
      try {
        work(p, s, tokenizer, counters);
      } catch (...) {
        p.fail(std::current_exception());
      }
    });
  try {
    consume(p, writer, s, bytes_total, progress, start);
  } catch (...) {
    p.fail(std::current_exception());
  }
  reader.join();
  for (std::thread& w : workers) w.join();
  if (p.error) std::rethrow_exception(p.error);
}

nlohmann::json options_json(const PrepSettings& s) {
  return {{"tokenizer", s.tokenizer == "train" || s.tokenizer == "byte" ? s.tokenizer : "file"},
          {"vocab", s.vocab},
          {"tokenizer_sample_bytes", s.tokenizer_sample_bytes},
          {"dedup",
           {{"exact", s.dedup.exact},
            {"near", s.dedup.near},
            {"jaccard", s.dedup.threshold},
            {"shingle_words", s.dedup.shingle_words}}},
          {"quality",
           {{"on", s.quality},
            {"tier_thresholds", s.tier_thresholds},
            {"tier_weights", s.tier_weights},
            {"drop_lowest_tier", s.drop_lowest_tier}}},
          {"max_document_bytes", s.max_document_bytes},
          {"max_line_bytes", s.max_line_bytes},
          {"max_bad_files", s.max_bad_files.text()},
          {"max_bad_lines", s.max_bad_lines.text()},
          {"shard_tokens", s.shard_tokens}};
}

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
  out.close();
  if (!out) MOE_RUN_FAILED("cannot write " << path.string() << "; is the disk full?");
}

}  // namespace

PrepResult run_prep(const PrepSettings& s, const std::function<void(const PrepProgress&)>& progress) {
  validate_prep_settings(s);
  const Clock::time_point start = Clock::now();
  std::vector<std::vector<std::string>> files;
  InputTally tally;
  tally.per_source.resize(s.inputs.size());
  for (size_t i = 0; i < s.inputs.size(); ++i) {
    std::vector<std::string> not_regular;
    files.push_back(list_input_files(s.inputs[i].path, &not_regular));
    tally.files_total += int64_t(files.back().size() + not_regular.size());
    for (const std::string& note : not_regular) skip_file(tally, i, note);
  }
  Counters counters;
  Tokenizer tokenizer{"byte", BpeTokenizer(), ""};
  if (s.tokenizer == "train") {
    const Clock::time_point t0 = Clock::now();
    tokenizer = train_tokenizer(s, files);
    counters.timings.tokenizer_training = seconds_since(t0);
  } else if (s.tokenizer != "byte") {
    tokenizer = load_tokenizer_file(s.tokenizer);
  }
  OutputDir partial(s.out);

  PrepManifest manifest;
  manifest.tokenizer.kind = tokenizer.kind;
  manifest.tokenizer.vocab = tokenizer.bpe.vocab();
  manifest.tokenizer.eod = kEndOfDocument;
  if (tokenizer.kind == "bpe") {
    manifest.tokenizer.file = "tokenizer.bpe";
    manifest.tokenizer.xxh64 = XXH64(tokenizer.file_bytes.data(), tokenizer.file_bytes.size(), 0);
    write_file(partial.path() / manifest.tokenizer.file, tokenizer.file_bytes);
  }
  manifest.token_bytes = manifest.tokenizer.vocab <= 65536 ? 2 : 4;
  manifest.options = options_json(s);

  Writer writer{s, partial.path().string(), manifest.token_bytes, Deduplicator(s.dedup), {}, {}, {}, {}};
  for (size_t i = 0; i < s.inputs.size(); ++i) {
    writer.sources.emplace_back();
    writer.sources.back().name = s.inputs[i].name;
    writer.sources.back().inputs = files[i];
  }
  run_pipeline(s, files, tokenizer, writer, tally, counters, progress);
  writer.finish();
  for (size_t i = 0; i < writer.sources.size(); ++i) {
    writer.sources[i].skipped_files = tally.per_source[i].files;
    writer.sources[i].skipped_lines = tally.per_source[i].lines;
  }
  manifest.sources = writer.sources;

  PrepResult result;
  const std::string text = manifest_to_json(manifest).dump(2) + "\n";
  write_file(partial.path() / kPrepManifestName, text);
  partial.commit();
  result.manifest = std::move(manifest);
  result.skipped = tally.all;
  result.files_total = tally.files_total;
  result.lines_total = tally.lines_total;
  result.manifest_xxh64 = XXH64(text.data(), text.size(), 0);
  result.timings = counters.timings;
  result.timings.dedup = writer.timings.dedup;
  result.timings.write = writer.timings.write;
  result.timings.wall = seconds_since(start);
  for (const PreparedSourceInfo& info : result.manifest.sources) result.bytes_in += info.bytes_in;
  return result;
}

}  // namespace moe::data
