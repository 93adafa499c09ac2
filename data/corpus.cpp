// Loading, splitting and validating corpora (see corpus.h). The embedded texts live in
// embedded_corpus.cpp; the sampling of sequences in loader.cpp.
#include "data/corpus.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <system_error>

#include "core/error.h"
#include "data/shards.h"
#include "data/tokenizer.h"

namespace moe::data {
namespace {

void check_heldout_fraction(double heldout_fraction) {
  // Both ends are excluded: every source needs a held-out split for eval_loss_by_source and a train split.
  if (!(heldout_fraction > 0.0 && heldout_fraction < 1.0))
    MOE_BAD_INPUT("data.heldout_fraction is " << heldout_fraction
                                              << "; it must be above 0 and below 1 (for example 0.05)");
}

std::string describe(const std::string& name, const std::string& path) {
  return MOE_STR_CAT("data source '" << name << "' (path " << path << ")");
}

std::string read_text_file(const SourceSpec& spec) {
  const std::string who = describe(spec.name, spec.path);
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(spec.path, ec);
  if (!std::filesystem::exists(status))
    MOE_BAD_INPUT(who << ": file not found; check data.sources[].path (relative paths are taken from "
                         "the working directory)");
  if (std::filesystem::is_directory(status))
    MOE_BAD_INPUT(who << ": a directory, not a regular file, and it holds no " << kPrepManifestName
                      << "; data.sources[].path must name a text file or a directory written by moe prep");
  if (!std::filesystem::is_regular_file(status))
    MOE_BAD_INPUT(who << ": not a regular file; data.sources[].path must name a text file or a prepared directory");
  std::ifstream in(spec.path, std::ios::binary);
  if (!in) MOE_BAD_INPUT(who << ": cannot be opened for reading; check its permissions");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) MOE_BAD_INPUT(who << ": read failed; check the file and the disk");
  if (bytes.empty()) MOE_BAD_INPUT(who << ": file is empty; a source needs text to train and evaluate on");
  return bytes;
}

void check_split(const Source& source, const char* split_name, int64_t tokens, int64_t seq_len, const char* remedy) {
  if (tokens < seq_len + 1)
    MOE_BAD_INPUT(describe(source.name, source.path)
                  << ": " << split_name << " split has " << tokens << " tokens"
                  << (source.prepared() ? " in its largest tier" : "")
                  << "; it needs at least seq_len+1 = " << seq_len + 1 << "; use a longer file or " << remedy);
}

int64_t rounded_heldout(int64_t total, double heldout_fraction) {
  // Rounded, not truncated, so a fraction such as 0.29 of 100 tokens is 29 and not 28.99999 -> 28.
  return std::llround(static_cast<double>(total) * heldout_fraction);
}

// The sources of one prepared directory that `specs` name, opened (and verified) once.
void add_prepared_sources(const std::string& path, const std::vector<const SourceSpec*>& specs, double heldout_fraction,
                          std::map<std::string, Source>& out) {
  std::vector<std::string> names;
  for (const SourceSpec* spec : specs) names.push_back(spec->name);
  const std::shared_ptr<const PreparedData> data = open_prepared(path, names);
  const PrepManifest& m = data->manifest;
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto info = std::find_if(m.sources.begin(), m.sources.end(),
                                   [&](const PreparedSourceInfo& s) { return s.name == names[i]; });
    Source source;
    source.name = specs[i]->name;
    source.path = path;
    source.weight = specs[i]->weight;
    source.origin = {"prepared", data->manifest_xxh64, m.tokenizer.kind, m.tokenizer.xxh64, m.tokenizer.vocab};
    for (size_t k = 0; k < info->segments.size(); ++k) {
      Segment seg;
      seg.tokens = data->streams[i][k];
      seg.heldout = rounded_heldout(seg.tokens->size(), heldout_fraction);
      seg.train = seg.tokens->size() - seg.heldout;
      seg.weight = info->segments[k].weight;
      seg.tier = info->segments[k].tier;
      source.segments.push_back(std::move(seg));
    }
    if (source.segments.empty())
      MOE_BAD_INPUT(describe(source.name, path) << ": the prepared source holds no documents (all removed by prep?)");
    out[source.name] = std::move(source);
  }
}

}  // namespace

Source make_source(std::string name, std::string path, double weight, std::vector<int32_t> tokens,
                   double heldout_fraction) {
  check_heldout_fraction(heldout_fraction);
  const int64_t total = static_cast<int64_t>(tokens.size());
  const int64_t heldout_tokens = rounded_heldout(total, heldout_fraction);
  Source source;
  source.name = std::move(name);
  source.path = std::move(path);
  source.weight = weight;
  source.heldout.assign(tokens.end() - heldout_tokens, tokens.end());
  tokens.resize(static_cast<size_t>(total - heldout_tokens));
  source.train = std::move(tokens);
  return source;
}

int64_t Source::train_tokens() const {
  if (!prepared()) return int64_t(train.size());
  int64_t total = 0;
  for (const Segment& seg : segments) total += seg.train;
  return total;
}

int64_t Source::heldout_tokens() const {
  if (!prepared()) return int64_t(heldout.size());
  int64_t total = 0;
  for (const Segment& seg : segments) total += seg.heldout;
  return total;
}

Corpus embedded_corpus(double heldout_fraction) {
  Corpus corpus;
  for (const EmbeddedText& text : embedded_texts()) {
    const std::string name(text.name);
    corpus.sources.push_back(
        make_source(name, "embedded:" + name + ".txt", 1.0, tokenize_bytes(text.bytes), heldout_fraction));
    corpus.sources.back().origin.kind = "embedded";
    corpus.sources.back().origin.content_xxh64 = XXH64(text.bytes.data(), text.bytes.size(), 0);
  }
  return corpus;
}

Corpus load_corpus(const std::vector<SourceSpec>& specs, double heldout_fraction) {
  check_heldout_fraction(heldout_fraction);
  if (specs.empty()) MOE_BAD_INPUT("data.sources is empty; list at least one {\"name\", \"path\", \"weight\"}");
  std::set<std::string> names;
  std::map<std::string, std::vector<const SourceSpec*>> prepared;  // by directory
  for (size_t i = 0; i < specs.size(); ++i) {
    const SourceSpec& spec = specs[i];
    if (spec.name.empty())
      MOE_BAD_INPUT("data.sources[" << i << "] (path " << spec.path
                                    << ") has an empty name; give every source "
                                       "a name (it labels eval_loss_by_source)");
    if (!names.insert(spec.name).second)
      MOE_BAD_INPUT(describe(spec.name, spec.path) << ": the name is used by another source too; names must be "
                                                      "unique");
    if (!(std::isfinite(spec.weight) && spec.weight > 0.0))
      MOE_BAD_INPUT(describe(spec.name, spec.path)
                    << ": weight is " << spec.weight << "; it must be a positive number (a relative probability)");
    if (is_prepared_dir(spec.path)) prepared[spec.path].push_back(&spec);
  }
  std::map<std::string, Source> opened;
  for (const auto& [path, group] : prepared) add_prepared_sources(path, group, heldout_fraction, opened);
  Corpus corpus;
  for (const SourceSpec& spec : specs) {
    if (opened.count(spec.name)) {
      corpus.sources.push_back(std::move(opened[spec.name]));
      continue;
    }
    const std::string bytes = read_text_file(spec);
    corpus.sources.push_back(make_source(spec.name, spec.path, spec.weight, tokenize_bytes(bytes), heldout_fraction));
    corpus.sources.back().origin.kind = "text";
    corpus.sources.back().origin.content_xxh64 = XXH64(bytes.data(), bytes.size(), 0);
  }
  return corpus;
}

nlohmann::json data_provenance(const Corpus& corpus) {
  nlohmann::json sources = nlohmann::json::array(), identity = nlohmann::json::array();
  for (const Source& s : corpus.sources) {
    const SourceOrigin& o = s.origin;
    nlohmann::json id = {{"name", s.name},
                         {"kind", o.kind},
                         {"xxh64", hex64(o.content_xxh64)},
                         {"tokenizer", o.tokenizer},
                         {"tokenizer_xxh64", hex64(o.tokenizer_xxh64)},
                         {"vocab", o.vocab}};
    identity.push_back(id);
    id["path"] = s.path;
    sources.push_back(std::move(id));
  }
  const std::string text = identity.dump();
  return {{"xxh64", hex64(XXH64(text.data(), text.size(), 0))}, {"sources", sources}};
}

void validate_sources(const Corpus& corpus, int64_t seq_len) {
  if (seq_len < 1) MOE_BAD_INPUT("train.seq_len is " << seq_len << "; it must be at least 1");
  if (corpus.sources.empty()) MOE_BAD_INPUT("the corpus has no sources; data.sources needs at least one");
  for (const Source& source : corpus.sources) {
    if (!(std::isfinite(source.weight) && source.weight > 0.0))
      MOE_BAD_INPUT(describe(source.name, source.path)
                    << ": weight is " << source.weight << "; it must be a positive number");
    int64_t train = int64_t(source.train.size()), heldout = int64_t(source.heldout.size());
    for (const Segment& seg : source.segments)
      train = std::max(train, seg.weight > 0 ? seg.train : 0), heldout = std::max(heldout, seg.heldout);
    check_split(source, "train", train, seq_len, "a smaller data.heldout_fraction");
    check_split(source, "held-out", heldout, seq_len, "a larger data.heldout_fraction");
  }
}

void validate_corpus(const Corpus& corpus, int64_t seq_len, int64_t vocab) {
  if (vocab < kByteVocab)
    MOE_BAD_INPUT("model.vocab is " << vocab << "; the byte tokenizer needs at least " << kByteVocab);
  validate_sources(corpus, seq_len);
  for (const Source& source : corpus.sources)
    if (source.origin.vocab > vocab)
      MOE_BAD_INPUT(describe(source.name, source.path)
                    << ": its tokenizer (" << source.origin.tokenizer << ") has " << source.origin.vocab
                    << " token ids (end-of-document included); model.vocab is " << vocab
                    << "; set model.vocab >= " << source.origin.vocab);
  for (const Source& source : corpus.sources)
    for (const Segment& seg : source.segments)
      if (seg.tokens->max_token() >= vocab)
        MOE_BAD_INPUT(describe(source.name, source.path)
                      << ": tier " << seg.tier << " holds token id " << seg.tokens->max_token()
                      << ", outside model.vocab " << vocab << " (ids 0.." << vocab - 1 << "); set model.vocab >= "
                      << seg.tokens->max_token() + 1 << " or prepare the data with a smaller vocabulary");
  for (const Source& source : corpus.sources)
    for (const std::vector<int32_t>* split : {&source.train, &source.heldout})
      for (const int32_t token : *split)
        if (token < 0 || token >= vocab)
          MOE_BAD_INPUT(describe(source.name, source.path) << ": token " << token << " is outside the vocabulary 0.."
                                                           << vocab - 1 << "; raise model.vocab or fix the data");
}

}  // namespace moe::data
