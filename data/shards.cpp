// Shards, their manifest, writing and verified reading (see shards.h).
#include "data/shards.h"

#include <fcntl.h>
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "core/error.h"

namespace moe::data {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

static_assert(std::endian::native == std::endian::little, "shards are little-endian and read in place");

// A field of the manifest, or BadInput naming it.
const json& field(const json& object, const char* name, const std::string& where, const std::string& path) {
  if (!object.is_object() || !object.contains(name))
    MOE_BAD_INPUT(path << ": " << where << " has no \"" << name
                       << "\"; the manifest is damaged or not written by moe prep (prepare the data again)");
  return object.at(name);
}

template <typename T>
T get(const json& object, const char* name, const std::string& where, const std::string& path) {
  const json& value = field(object, name, where, path);
  try {
    return value.get<T>();
  } catch (const json::exception&) {
    MOE_BAD_INPUT(path << ": " << where << "." << name << " = " << value.dump() << " has the wrong type");
  }
}

uint64_t get_hash(const json& object, const char* name, const std::string& where, const std::string& path) {
  uint64_t value = 0;
  if (!parse_hex64(get<std::string>(object, name, where, path), &value))
    MOE_BAD_INPUT(path << ": " << where << "." << name << " is not 16 hex digits");
  return value;
}

json shard_to_json(const ShardInfo& s) {
  return {{"file", s.file},           {"index", s.index},        {"tokens", s.tokens},
          {"documents", s.documents}, {"xxh64", hex64(s.xxh64)}, {"index_xxh64", hex64(s.index_xxh64)}};
}

ShardInfo shard_from_json(const json& j, const std::string& where, const std::string& path) {
  ShardInfo s;
  s.file = get<std::string>(j, "file", where, path);
  s.index = get<std::string>(j, "index", where, path);
  s.tokens = get<int64_t>(j, "tokens", where, path);
  s.documents = get<int64_t>(j, "documents", where, path);
  s.xxh64 = get_hash(j, "xxh64", where, path);
  s.index_xxh64 = get_hash(j, "index_xxh64", where, path);
  // Shard files are named by the manifest: keep them inside the directory.
  for (const std::string* name : {&s.file, &s.index})
    if (name->empty() || name->find('/') != std::string::npos || *name == "." || *name == "..")
      MOE_BAD_INPUT(path << ": " << where << " names file '" << *name
                         << "'; expected a file name inside the directory");
  if (s.tokens < 0 || s.documents < 0) MOE_BAD_INPUT(path << ": " << where << " has a negative count");
  return s;
}

json source_to_json(const PreparedSourceInfo& s) {
  json segments = json::array();
  for (const SegmentInfo& seg : s.segments) {
    json shards = json::array();
    for (const ShardInfo& shard : seg.shards) shards.push_back(shard_to_json(shard));
    segments.push_back({{"tier", seg.tier},
                        {"weight", seg.weight},
                        {"tokens", seg.tokens},
                        {"documents", seg.documents},
                        {"shards", shards}});
  }
  return {{"name", s.name},
          {"inputs", s.inputs},
          {"documents_in", s.documents_in},
          {"bytes_in", s.bytes_in},
          {"removed",
           {{"exact", s.removed.exact},
            {"near", s.removed.near},
            {"quality", s.removed.quality},
            {"empty", s.removed.empty}}},
          {"skipped", {{"files", s.skipped_files}, {"lines", s.skipped_lines}}},
          {"documents", s.documents},
          {"tokens", s.tokens},
          {"segments", segments}};
}

PreparedSourceInfo source_from_json(const json& j, const std::string& where, const std::string& path) {
  PreparedSourceInfo s;
  s.name = get<std::string>(j, "name", where, path);
  s.inputs = get<std::vector<std::string>>(j, "inputs", where, path);
  s.documents_in = get<int64_t>(j, "documents_in", where, path);
  s.bytes_in = get<int64_t>(j, "bytes_in", where, path);
  const json& removed = field(j, "removed", where, path);
  s.removed = {get<int64_t>(removed, "exact", where + ".removed", path),
               get<int64_t>(removed, "near", where + ".removed", path),
               get<int64_t>(removed, "quality", where + ".removed", path),
               get<int64_t>(removed, "empty", where + ".removed", path)};
  if (j.contains("skipped")) {  // absent from manifests written before prep skipped anything
    s.skipped_files = get<int64_t>(j.at("skipped"), "files", where + ".skipped", path);
    s.skipped_lines = get<int64_t>(j.at("skipped"), "lines", where + ".skipped", path);
  }
  s.documents = get<int64_t>(j, "documents", where, path);
  s.tokens = get<int64_t>(j, "tokens", where, path);
  const json& segments = field(j, "segments", where, path);
  if (!segments.is_array()) MOE_BAD_INPUT(path << ": " << where << ".segments is not a list");
  for (size_t i = 0; i < segments.size(); ++i) {
    const std::string at = where + ".segments[" + std::to_string(i) + "]";
    SegmentInfo seg;
    seg.tier = get<int32_t>(segments[i], "tier", at, path);
    seg.weight = get<double>(segments[i], "weight", at, path);
    seg.tokens = get<int64_t>(segments[i], "tokens", at, path);
    seg.documents = get<int64_t>(segments[i], "documents", at, path);
    const json& shards = field(segments[i], "shards", at, path);
    if (!shards.is_array()) MOE_BAD_INPUT(path << ": " << at << ".shards is not a list");
    for (size_t k = 0; k < shards.size(); ++k)
      seg.shards.push_back(shard_from_json(shards[k], at + ".shards[" + std::to_string(k) + "]", path));
    if (!(seg.weight >= 0)) MOE_BAD_INPUT(path << ": " << at << ".weight is " << seg.weight << "; expected >= 0");
    s.segments.push_back(std::move(seg));
  }
  return s;
}

}  // namespace

json manifest_to_json(const PrepManifest& m) {
  json sources = json::array();
  for (const PreparedSourceInfo& s : m.sources) sources.push_back(source_to_json(s));
  return {{"format", "moe-prep"},
          {"version", m.version},
          {"tokenizer",
           {{"kind", m.tokenizer.kind},
            {"file", m.tokenizer.file},
            {"xxh64", hex64(m.tokenizer.xxh64)},
            {"vocab", m.tokenizer.vocab},
            {"eod", m.tokenizer.eod}}},
          {"token_bytes", m.token_bytes},
          {"options", m.options},
          {"sources", sources}};
}

PrepManifest manifest_from_json(const json& j, const std::string& path) {
  if (!j.is_object() || j.value("format", "") != "moe-prep")
    MOE_BAD_INPUT(path << ": not a moe prep manifest (no \"format\": \"moe-prep\"); prepare the data with moe prep");
  PrepManifest m;
  m.version = get<int>(j, "version", "the manifest", path);
  if (m.version != kPrepFormatVersion)
    MOE_BAD_INPUT(path << ": format version " << m.version << "; this moe reads version " << kPrepFormatVersion
                       << " (prepare the data again with this moe)");
  const json& t = field(j, "tokenizer", "the manifest", path);
  m.tokenizer.kind = get<std::string>(t, "kind", "tokenizer", path);
  m.tokenizer.file = get<std::string>(t, "file", "tokenizer", path);
  m.tokenizer.xxh64 = get_hash(t, "xxh64", "tokenizer", path);
  m.tokenizer.vocab = get<int64_t>(t, "vocab", "tokenizer", path);
  m.tokenizer.eod = get<int32_t>(t, "eod", "tokenizer", path);
  m.token_bytes = get<int32_t>(j, "token_bytes", "the manifest", path);
  if (m.token_bytes != 2 && m.token_bytes != 4)
    MOE_BAD_INPUT(path << ": token_bytes is " << m.token_bytes << "; expected 2 or 4");
  m.options = j.value("options", json::object());
  const json& sources = field(j, "sources", "the manifest", path);
  if (!sources.is_array()) MOE_BAD_INPUT(path << ": sources is not a list");
  for (size_t i = 0; i < sources.size(); ++i)
    m.sources.push_back(source_from_json(sources[i], "sources[" + std::to_string(i) + "]", path));
  return m;
}

// ---- Writing --------------------------------------------------------------------------------------------

struct ShardWriter::Open {
  ShardInfo info;
  std::FILE* tokens = nullptr;
  std::FILE* index = nullptr;
  XXH64_state_t* tokens_hash = XXH64_createState();
  XXH64_state_t* index_hash = XXH64_createState();
  std::vector<unsigned char> buffer;
  ~Open() {
    if (tokens) std::fclose(tokens);
    if (index) std::fclose(index);
    XXH64_freeState(tokens_hash);
    XXH64_freeState(index_hash);
  }
};

ShardWriter::ShardWriter(std::string dir, std::string stem, int32_t token_bytes, int64_t shard_tokens)
    : dir_(std::move(dir)), stem_(std::move(stem)), token_bytes_(token_bytes), shard_tokens_(shard_tokens) {
  MOE_CHECK(token_bytes == 2 || token_bytes == 4, "token_bytes " << token_bytes);
  MOE_CHECK(shard_tokens >= 1, "shard_tokens " << shard_tokens);
}

ShardWriter::~ShardWriter() = default;

void ShardWriter::open_shard() {
  open_ = std::make_unique<Open>();
  char number[16];
  std::snprintf(number, sizeof(number), "%05zu", done_.size());
  open_->info.file = stem_ + "." + number + ".bin";
  open_->info.index = stem_ + "." + number + ".idx";
  open_->tokens = std::fopen((fs::path(dir_) / open_->info.file).c_str(), "wb");
  open_->index = std::fopen((fs::path(dir_) / open_->info.index).c_str(), "wb");
  if (!open_->tokens || !open_->index)
    MOE_RUN_FAILED("cannot create shard " << (fs::path(dir_) / open_->info.file) << ": " << std::strerror(errno));
  XXH64_reset(open_->tokens_hash, 0);
  XXH64_reset(open_->index_hash, 0);
}

void ShardWriter::close_shard() {
  Open& o = *open_;
  const bool failed =
      std::fflush(o.tokens) != 0 || std::fflush(o.index) != 0 || std::ferror(o.tokens) || std::ferror(o.index);
  if (failed) MOE_RUN_FAILED("writing shard " << (fs::path(dir_) / o.info.file) << " failed; is the disk full?");
  o.info.xxh64 = XXH64_digest(o.tokens_hash);
  o.info.index_xxh64 = XXH64_digest(o.index_hash);
  done_.push_back(o.info);
  open_.reset();
}

void ShardWriter::append_document(const int32_t* tokens, int64_t count, int32_t eod) {
  if (!open_) open_shard();
  Open& o = *open_;
  o.buffer.resize(size_t(count + 1) * size_t(token_bytes_));
  for (int64_t i = 0; i <= count; ++i) {
    const uint32_t t = uint32_t(i < count ? tokens[i] : eod);
    if (token_bytes_ == 2) {
      const uint16_t narrow = uint16_t(t);
      std::memcpy(o.buffer.data() + i * 2, &narrow, 2);
    } else {
      std::memcpy(o.buffer.data() + i * 4, &t, 4);
    }
  }
  std::fwrite(o.buffer.data(), 1, o.buffer.size(), o.tokens);
  XXH64_update(o.tokens_hash, o.buffer.data(), o.buffer.size());
  o.info.tokens += count + 1;
  o.info.documents += 1;
  const uint64_t end = uint64_t(o.info.tokens);
  std::fwrite(&end, 8, 1, o.index);
  XXH64_update(o.index_hash, &end, 8);
  if (o.info.tokens >= shard_tokens_) close_shard();
}

std::vector<ShardInfo> ShardWriter::finish() {
  if (open_) close_shard();
  return done_;
}

// ---- Reading --------------------------------------------------------------------------------------------

namespace {

// Tokens at `bytes` (count of them, token_bytes each, little-endian) into out, in place: out may hold the
// bytes themselves, as 2-byte tokens widen from the last down without overwriting any not yet read.
void widen_tokens(const unsigned char* bytes, int64_t count, int32_t token_bytes, int32_t* out) {
  for (int64_t i = count - 1; i >= 0; --i) {
    if (token_bytes == 2) {
      uint16_t t;
      std::memcpy(&t, bytes + i * 2, 2);
      out[i] = int32_t(t);
    } else {
      uint32_t t;
      std::memcpy(&t, bytes + i * 4, 4);
      out[i] = int32_t(t);
    }
  }
}

}  // namespace

TokenStream::TokenStream(std::vector<ShardFile> shards, int32_t token_bytes, int64_t vocab, int64_t max_token)
    : shards_(std::move(shards)), token_bytes_(token_bytes), vocab_(vocab), max_token_(max_token) {
  int64_t total = 0;
  for (const ShardFile& f : shards_) ends_.push_back(total += int64_t(f.size()) / token_bytes_);
}

void TokenStream::read(int64_t offset, int64_t count, int32_t* out) const {
  MOE_CHECK(offset >= 0 && count >= 0 && offset + count <= size(),
            "tokens [" << offset << ", " << offset + count << ") of " << size());
  size_t shard = size_t(std::upper_bound(ends_.begin(), ends_.end(), offset) - ends_.begin());
  while (count > 0) {
    const int64_t begin = shard == 0 ? 0 : ends_[shard - 1];
    const int64_t take = std::min(count, ends_[shard] - offset);
    // Read into out itself (4 bytes a token, at least token_bytes), then widen in place.
    shards_[shard].read(uint64_t(offset - begin) * uint64_t(token_bytes_), size_t(take) * size_t(token_bytes_), out);
    widen_tokens(reinterpret_cast<const unsigned char*>(out), take, token_bytes_, out);
    for (int64_t i = 0; i < take; ++i)
      if (uint32_t(out[i]) >= uint64_t(vocab_))
        MOE_RUN_FAILED("shard " << shards_[shard].path() << " holds token id " << uint32_t(out[i]) << " at token "
                                << offset - begin + i << ", outside the tokenizer's vocabulary 0.." << vocab_ - 1
                                << "; it changed since it was verified (restore it or prepare the "
                                << "data again)");
    out += take, offset += take, count -= take, ++shard;
  }
}

namespace {

// Largest manifest.json read: a manifest lists every input file, a few MB for hundreds of thousands.
constexpr uint64_t kMaxManifestBytes = uint64_t(256) << 20;

std::string shard_name(const ShardFile& f) { return fs::path(f.path()).filename().string(); }

// Opens one file of a shard; BadInput saying it is missing when it is.
ShardFile open_shard_file(const std::string& dir, const std::string& name) {
  std::error_code ec;
  const fs::path path = fs::path(dir) / name;
  if (!fs::exists(fs::symlink_status(path, ec)))
    MOE_BAD_INPUT("prepared data " << dir << ": shard file " << name
                                   << " is missing; the directory is incomplete (prepare the data again)");
  return ShardFile(path.string());
}

void check_size_and_hash(const ShardFile& f, uint64_t bytes, uint64_t want_bytes, uint64_t hash, uint64_t want_hash,
                         const std::string& dir) {
  if (bytes != want_bytes)
    MOE_BAD_INPUT("prepared data " << dir << ": shard file " << shard_name(f) << " has " << bytes
                                   << " bytes; the manifest says " << want_bytes
                                   << " (damaged or truncated; prepare the data again)");
  if (hash != want_hash)
    MOE_BAD_INPUT("prepared data " << dir << ": shard file " << shard_name(f) << " has xxh64 " << hex64(hash)
                                   << "; the manifest says " << hex64(want_hash)
                                   << " (damaged; prepare the data again)");
}

// Reads a token shard once through its descriptor: its size and xxh64 against the manifest's, and its
// largest token id, which must be below the tokenizer's vocabulary. Returns that id (-1 when empty).
int64_t verify_tokens(const ShardFile& f, const ShardInfo& shard, const PrepManifest& m, const std::string& dir) {
  std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> state(XXH64_createState(), &XXH64_freeState);
  XXH64_reset(state.get(), 0);
  const uint64_t want_bytes = uint64_t(shard.tokens) * uint64_t(m.token_bytes);
  if (f.size() != want_bytes) check_size_and_hash(f, f.size(), want_bytes, 0, 0, dir);
  std::vector<int32_t> tokens(size_t(1) << 18);
  int64_t max_token = -1;
  for (uint64_t at = 0; at < f.size();) {
    const size_t n = size_t(std::min<uint64_t>(tokens.size() * size_t(m.token_bytes), f.size() - at));
    f.read(at, n, tokens.data());
    XXH64_update(state.get(), tokens.data(), n);
    widen_tokens(reinterpret_cast<const unsigned char*>(tokens.data()), int64_t(n) / m.token_bytes, m.token_bytes,
                 tokens.data());
    for (size_t i = 0; i < n / size_t(m.token_bytes); ++i)
      max_token = std::max<int64_t>(max_token, uint32_t(tokens[i]));
    at += n;
  }
  ::posix_fadvise(f.fd(), 0, 0, POSIX_FADV_DONTNEED);  // the pages read are the page cache's; they may go
  check_size_and_hash(f, f.size(), want_bytes, XXH64_digest(state.get()), shard.xxh64, dir);
  if (max_token >= m.tokenizer.vocab)
    MOE_BAD_INPUT("prepared data " << dir << ": shard file " << shard_name(f) << " holds token id " << max_token
                                   << "; the manifest's tokenizer has " << m.tokenizer.vocab << " ids (0.."
                                   << m.tokenizer.vocab - 1
                                   << "), so the manifest or the shard is damaged (prepare the data again)");
  return max_token;
}

void check_tokenizer_fields(const PrepManifest& m, const std::string& path) {
  if (m.tokenizer.vocab < 1 || m.tokenizer.vocab >= (int64_t(1) << 31))
    MOE_BAD_INPUT(path << ": tokenizer.vocab is " << m.tokenizer.vocab << "; expected an integer in [1, 2^31)");
  if (m.token_bytes == 2 && m.tokenizer.vocab > 65536)
    MOE_BAD_INPUT(path << ": token_bytes is 2 but tokenizer.vocab is " << m.tokenizer.vocab << " (> 65536)");
  if (m.tokenizer.eod < 0 || m.tokenizer.eod >= m.tokenizer.vocab)
    MOE_BAD_INPUT(path << ": tokenizer.eod is " << m.tokenizer.eod << "; expected an id in [0, "
                       << m.tokenizer.vocab - 1 << "]");
}

// The streams of one source: every shard opened, verified and checked against the tokenizer.
std::vector<std::shared_ptr<const TokenStream>> open_source(const PreparedSourceInfo& source, const PrepManifest& m,
                                                            const std::string& dir) {
  std::vector<std::shared_ptr<const TokenStream>> streams;
  for (const SegmentInfo& seg : source.segments) {
    std::vector<ShardFile> files;
    int64_t max_token = -1;
    for (const ShardInfo& shard : seg.shards) {
      files.push_back(open_shard_file(dir, shard.file));
      max_token = std::max(max_token, verify_tokens(files.back(), shard, m, dir));
      const ShardFile index = open_shard_file(dir, shard.index);
      uint64_t bytes = 0;
      const uint64_t hash = file_xxh64(index.path(), &bytes);
      check_size_and_hash(index, bytes, uint64_t(shard.documents) * 8, hash, shard.index_xxh64, dir);
    }
    streams.push_back(std::make_shared<TokenStream>(std::move(files), m.token_bytes, m.tokenizer.vocab, max_token));
  }
  return streams;
}

}  // namespace

bool is_prepared_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::is_regular_file(fs::path(path) / kPrepManifestName, ec);
}

std::shared_ptr<const PreparedData> open_prepared(const std::string& dir, const std::vector<std::string>& names) {
  const fs::path manifest_path = fs::path(dir) / kPrepManifestName;
  if (!is_prepared_dir(dir))
    MOE_BAD_INPUT("prepared data " << dir << ": no " << kPrepManifestName
                                   << " in it; expected a directory written by moe prep");
  auto data = std::make_shared<PreparedData>();
  data->dir = dir;
  const std::string text = read_regular_file(manifest_path.string(), kMaxManifestBytes, manifest_path.string());
  data->manifest_xxh64 = XXH64(text.data(), text.size(), 0);
  const json document = json::parse(text, nullptr, false);
  if (document.is_discarded())
    MOE_BAD_INPUT(manifest_path.string() << ": not valid JSON; the manifest is damaged (prepare the data again)");
  data->manifest = manifest_from_json(document, manifest_path.string());
  check_tokenizer_fields(data->manifest, manifest_path.string());
  const PrepManifest& m = data->manifest;
  for (const std::string& name : names) {
    const auto it =
        std::find_if(m.sources.begin(), m.sources.end(), [&](const PreparedSourceInfo& s) { return s.name == name; });
    if (it == m.sources.end()) {
      std::string have;
      for (const PreparedSourceInfo& s : m.sources) have += (have.empty() ? "'" : ", '") + s.name + "'";
      MOE_BAD_INPUT("prepared data " << dir << " has no source '" << name << "'; it has " << have
                                     << " (a data.sources entry naming a prepared directory takes the source of "
                                        "its name)");
    }
    data->streams.push_back(open_source(*it, m, dir));
  }
  return data;
}

}  // namespace moe::data
