// Listing input files and reading their documents (see prep_input.h).
#include "data/prep_input.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace moe::data {
namespace {

namespace fs = std::filesystem;

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

bool hidden(const fs::path& p) {
  const std::string name = p.filename().string();
  return !name.empty() && name[0] == '.';
}

constexpr unsigned kReadBytes = 1u << 20;

}  // namespace

struct DocumentReader::Gz {
  gzFile file = nullptr;
  ~Gz() {
    if (file) gzclose(file);
  }
};

std::vector<std::string> list_input_files(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status)) MOE_BAD_INPUT("--input " << path << ": no such file or directory");
  if (fs::is_regular_file(status)) return {path};
  if (!fs::is_directory(status)) MOE_BAD_INPUT("--input " << path << ": not a regular file or a directory");
  std::vector<std::string> files;
  for (auto it = fs::recursive_directory_iterator(path, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (hidden(it->path())) {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file()) files.push_back(it->path().string());
  }
  if (ec) MOE_BAD_INPUT("--input " << path << ": cannot list the directory (" << ec.message() << ")");
  if (files.empty()) MOE_BAD_INPUT("--input " << path << ": the directory holds no files");
  std::sort(files.begin(), files.end());
  return files;
}

bool is_jsonl_name(const std::string& path) {
  std::string name = path;
  if (ends_with(name, ".gz")) name.resize(name.size() - 3);
  return ends_with(name, ".jsonl") || ends_with(name, ".ndjson") || ends_with(name, ".json");
}

DocumentReader::DocumentReader(const std::string& path, int64_t max_document_bytes)
    : gz_(std::make_unique<Gz>()), path_(path), jsonl_(is_jsonl_name(path)), max_document_bytes_(max_document_bytes) {
  // gzopen reads a file that is not gzip as it is, so one reader serves both.
  gz_->file = gzopen(path.c_str(), "rb");
  if (!gz_->file) MOE_BAD_INPUT(path << ": cannot be opened for reading (" << std::strerror(errno) << ")");
  gzbuffer(gz_->file, kReadBytes);
}

DocumentReader::~DocumentReader() = default;

int64_t DocumentReader::consumed() const { return int64_t(gzoffset(gz_->file)); }

bool DocumentReader::next_line(std::string& line) {
  line.clear();
  char buffer[1 << 16];
  while (gzgets(gz_->file, buffer, sizeof(buffer))) {
    line += buffer;
    if (!line.empty() && line.back() == '\n') return true;
  }
  int code = 0;
  const char* message = gzerror(gz_->file, &code);
  if (code != Z_OK)
    MOE_BAD_INPUT(path_ << ": damaged or truncated compressed data near line " << line_ + 1 << " (" << message << ")");
  return !line.empty();
}

bool DocumentReader::next_text(std::string& text) {
  text.clear();
  for (;;) {
    // A document ends at the first line end after max_document_bytes, or at the end of the file.
    if (int64_t(pending_.size()) >= max_document_bytes_) {
      size_t cut = pending_.find('\n', size_t(max_document_bytes_));
      // No line end for long (one huge line): cut anyway, so memory stays bounded.
      if (cut == std::string::npos && int64_t(pending_.size()) >= 4 * max_document_bytes_)
        cut = size_t(max_document_bytes_) - 1;
      if (cut != std::string::npos) {
        text.assign(pending_, 0, cut + 1);
        pending_.erase(0, cut + 1);
        return true;
      }
    }
    if (eof_) break;
    const size_t had = pending_.size();
    pending_.resize(had + kReadBytes);
    const int n = gzread(gz_->file, pending_.data() + had, kReadBytes);
    if (n < 0) {
      int code = 0;
      MOE_BAD_INPUT(path_ << ": read failed (" << gzerror(gz_->file, &code) << ")");
    }
    pending_.resize(had + size_t(n));
    if (n == 0) {
      int code = 0;
      const char* message = gzerror(gz_->file, &code);
      if (code != Z_OK) MOE_BAD_INPUT(path_ << ": damaged or truncated compressed data (" << message << ")");
      eof_ = true;
    }
  }
  text.swap(pending_);
  pending_.clear();
  return !text.empty();
}

bool DocumentReader::next(std::string& text) {
  if (!jsonl_) return next_text(text);
  std::string line;
  while (next_line(line)) {
    ++line_;
    if (line.find_first_not_of(" \t\r\n") == std::string::npos) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      MOE_BAD_INPUT(path_ << ":" << line_ << ": not a JSON object; a JSON Lines input holds one object a line");
    const auto it = j.find("text");
    if (it == j.end() || !it->is_string())
      MOE_BAD_INPUT(path_ << ":" << line_ << ": no string field \"text\"; each line must be {\"text\": \"...\", ...}");
    text = it->get<std::string>();
    return true;
  }
  return false;
}

}  // namespace moe::data
