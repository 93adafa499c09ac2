// `moe prep`'s pipeline as a library (docs/data.md "Preparing data"): read the inputs' documents,
// train or load the tokenizer, drop exact and near duplicates across every source, score quality into
// tiers, tokenize, and write token shards with their manifest into a new directory. One reader thread,
// worker threads for the per-document work, and one thread that takes every decision in input order,
// so the output is the same whatever the number of threads; memory is bounded by the batches in flight
// plus the deduplication index. Not here: the command line (launch/commands/prep_command.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/dedup.h"
#include "data/prep_input.h"
#include "data/shards.h"

namespace moe::data {

struct PrepInput {
  std::string name;  // the source: letters, digits, '_', '-', '.'
  std::string path;  // a file or a directory of them
};

struct PrepSettings {
  std::vector<PrepInput> inputs;
  std::string out;                                     // a new directory
  std::string tokenizer = "train";                     // "train", "byte" or the path of a tokenizer file
  int64_t vocab = 32768;                               // for "train": ids, bytes and end-of-document included
  int64_t tokenizer_sample_bytes = int64_t(32) << 20;  // for "train": read from the inputs' starts, split evenly
  int threads = 1;                                     // worker threads
  DedupSettings dedup;
  bool quality = true;                                 // false: every document in tier 0
  std::vector<double> tier_thresholds = {1.0, 0.7};    // descending scores; tiers = thresholds + 1
  std::vector<double> tier_weights = {1.0, 0.5, 0.1};  // sampling weight of each tier, best first
  bool drop_lowest_tier = false;                       // remove the lowest tier's documents instead
  int64_t shard_tokens = int64_t(1) << 27;             // tokens per shard file (256 MiB of uint16)
  int64_t max_document_bytes = int64_t(1) << 20;       // plain text is cut into documents of about this
  int64_t max_line_bytes = kDefaultMaxLineBytes;       // longer JSON Lines lines are skipped unread
  InputBound max_bad_files{0.1, true};                 // files that cannot be read, skipped up to this
  InputBound max_bad_lines{0.1, true};                 // JSON Lines lines skipped up to this
};

struct PrepProgress {
  int64_t bytes_done = 0, bytes_total = 0;  // of the input files (compressed bytes for gzip)
  int64_t documents = 0;
  double seconds = 0;
};

// Seconds spent in each stage, summed over the threads that run it (CPU seconds, for the benchmark).
struct PrepTimings {
  double read = 0, tokenizer_training = 0, quality = 0, signature = 0, tokenize = 0, dedup = 0, write = 0;
  double wall = 0;
};

struct PrepResult {
  PrepManifest manifest;
  SkippedInputs skipped;                     // over every source
  int64_t files_total = 0, lines_total = 0;  // input files listed, non-blank JSON Lines lines read
  uint64_t manifest_xxh64 = 0;
  PrepTimings timings;
  int64_t bytes_in = 0;  // uncompressed document bytes read
};

// Every check of the settings, the inputs' existence and the tokenizer file, before anything is read or
// written. Throws BadInput naming the option and value.
void validate_prep_settings(const PrepSettings& settings);

// Runs the pipeline into settings.out, which must not exist: the shards are written into a sibling
// directory that is renamed to settings.out once the manifest is complete, and removed on failure. Input
// files that cannot be read and malformed JSON Lines lines are skipped and counted; past
// settings.max_bad_files or max_bad_lines it stops with BadInput naming the first few, writing nothing.
PrepResult run_prep(const PrepSettings& settings, const std::function<void(const PrepProgress&)>& progress = {});

}  // namespace moe::data
