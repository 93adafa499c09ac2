// Listing input files and reading their documents (see prep_input.h).
#include "data/prep_input.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "data/file_io.h"

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

// What a directory entry that is not a regular file is, for the list of skipped files.
std::string not_regular_note(const fs::directory_entry& entry) {
  std::error_code ec;
  const fs::file_status status = entry.status(ec);
  std::string what;
  if (ec) {
    what = ec.value() == ENOENT ? "a dangling symbolic link" : "cannot be examined (" + ec.message() + ")";
  } else {
    switch (status.type()) {
      case fs::file_type::directory:
        what = "a symbolic link to a directory (not followed)";
        break;
      case fs::file_type::fifo:
        what = "a FIFO";
        break;
      case fs::file_type::character:
        what = "a character device";
        break;
      case fs::file_type::block:
        what = "a block device";
        break;
      case fs::file_type::socket:
        what = "a socket";
        break;
      default:
        what = "not a regular file";
        break;
    }
  }
  return entry.path().string() + ": " + what + ", not a regular file";
}

// A note fit to print: at most 300 bytes, control bytes and bytes above ASCII shown as '?'.
std::string printable(const std::string& text) {
  std::string out = text.substr(0, 300);
  for (char& c : out)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  return text.size() > 300 ? out + "..." : out;
}

}  // namespace

struct DocumentReader::Gz {
  gzFile file = nullptr;
  ~Gz() {
    if (file) gzclose(file);
  }
};

std::vector<std::string> list_input_files(const std::string& path, std::vector<std::string>* not_regular) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status))
    MOE_BAD_INPUT("--input " << path << ": no such file or directory"
                             << (ec && ec.value() != ENOENT ? " (" + ec.message() + ")" : ""));
  if (fs::is_regular_file(status)) return {path};
  if (!fs::is_directory(status)) MOE_BAD_INPUT("--input " << path << ": not a regular file or a directory");
  std::vector<std::string> files, others;
  for (auto it = fs::recursive_directory_iterator(path, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (hidden(it->path())) {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    std::error_code entry_ec;
    if (it->is_regular_file(entry_ec)) {
      files.push_back(it->path().string());
    } else if (!(it->is_directory(entry_ec) && !it->is_symlink(entry_ec))) {
      others.push_back(not_regular_note(*it));
    }
  }
  if (ec) MOE_BAD_INPUT("--input " << path << ": cannot list the directory (" << ec.message() << ")");
  if (files.empty() && others.empty()) MOE_BAD_INPUT("--input " << path << ": the directory holds no files");
  std::sort(files.begin(), files.end());
  std::sort(others.begin(), others.end());
  if (not_regular) not_regular->insert(not_regular->end(), others.begin(), others.end());
  return files;
}

bool is_jsonl_name(const std::string& path) {
  std::string name = path;
  if (ends_with(name, ".gz")) name.resize(name.size() - 3);
  return ends_with(name, ".jsonl") || ends_with(name, ".ndjson") || ends_with(name, ".json");
}

int64_t InputBound::allowed(int64_t total) const {
  return percent ? int64_t(std::floor(double(total) * value / 100.0 + 1e-9)) : int64_t(value);
}

std::string InputBound::text() const {
  std::ostringstream out;
  out << value << (percent ? "%" : "");
  return out.str();
}

InputBound parse_input_bound(const std::string& text, const std::string& option) {
  InputBound bound;
  bound.percent = !text.empty() && text.back() == '%';
  const std::string number = bound.percent ? text.substr(0, text.size() - 1) : text;
  size_t used = 0;
  try {
    bound.value = std::stod(number, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const bool integer = bound.value == std::floor(bound.value);
  if (number.empty() || used != number.size() || !(bound.value >= 0) ||
      (bound.percent ? bound.value > 100 : (!integer || bound.value > 1e15)))
    MOE_BAD_INPUT(option << " " << text << ": expected a count (an integer >= 0) or a percentage (0% to 100%)");
  return bound;
}

void SkippedInputs::add_file(const std::string& note) {
  if (named_files.size() < kNamed) named_files.push_back(printable(note));
  ++files;
}

void SkippedInputs::add_line(const std::string& note) {
  if (named_lines.size() < kNamed) named_lines.push_back(printable(note));
  ++lines;
}

DocumentReader::DocumentReader(const std::string& path, int64_t max_document_bytes, int64_t max_line_bytes)
    : gz_(std::make_unique<Gz>()),
      path_(path),
      jsonl_(is_jsonl_name(path)),
      max_document_bytes_(max_document_bytes),
      max_line_bytes_(max_line_bytes) {
  UniqueFd fd = open_regular_file(path, path);
  // gzdopen reads a file that is not gzip as it is, so one reader serves both; it owns the descriptor.
  gz_->file = gzdopen(fd.get(), "rb");
  if (!gz_->file) MOE_BAD_INPUT(path << ": cannot be opened for reading (out of memory)");
  fd.release();
  gzbuffer(gz_->file, kReadBytes);
  if (jsonl_) buffer_.resize(kReadBytes);
}

DocumentReader::~DocumentReader() = default;

int64_t DocumentReader::consumed() const { return int64_t(gzoffset(gz_->file)); }

// The next bytes into buffer_; false at the end of the file.
bool DocumentReader::fill() {
  if (eof_) return false;
  const int n = gzread(gz_->file, buffer_.data(), unsigned(buffer_.size()));
  int code = Z_OK;
  const char* message = gzerror(gz_->file, &code);
  if (n < 0 || (n == 0 && code != Z_OK))
    MOE_BAD_INPUT(path_ << ": damaged or truncated compressed data near line " << line_ + 1 << " (" << message << ")");
  begin_ = 0, end_ = size_t(n);
  eof_ = n == 0;
  return n > 0;
}

// The next line, without its '\n', into `line`; a line longer than max_line_bytes_ is passed over without
// being held (TooLong, `line` empty).
DocumentReader::Line DocumentReader::next_line(std::string& line) {
  line.clear();
  bool any = false, too_long = false;
  for (;;) {
    if (begin_ == end_ && !fill()) return !any ? Line::End : too_long ? Line::TooLong : Line::Whole;
    any = true;
    const char* start = buffer_.data() + begin_;
    const char* end = static_cast<const char*>(std::memchr(start, '\n', end_ - begin_));
    const size_t n = end ? size_t(end - start) : end_ - begin_;
    if (!too_long && int64_t(line.size() + n) > max_line_bytes_) {
      too_long = true;
      std::string().swap(line);
    }
    if (!too_long) line.append(start, n);
    begin_ += n + (end ? 1 : 0);
    if (end) return too_long ? Line::TooLong : Line::Whole;
  }
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
    int code = Z_OK;
    const char* message = gzerror(gz_->file, &code);
    if (n < 0 || (n == 0 && code != Z_OK))
      MOE_BAD_INPUT(path_ << ": damaged or truncated compressed data (" << message << ")");
    pending_.resize(had + size_t(n));
    eof_ = n == 0;
  }
  text.swap(pending_);
  pending_.clear();
  return !text.empty();
}

// The "text" of one JSON Lines line into `text`; false (the line counted as skipped) when it has none.
bool DocumentReader::document_of(const std::string& line, std::string& text) {
  const std::string where = path_ + ":" + std::to_string(line_) + ": ";
  // nlohmann's parser takes a NUL byte for the end of its input and would read "{...}\0anything" as the
  // object alone: a raw NUL is never valid JSON (a string escapes it as \u0000), so the line is malformed.
  if (const size_t nul = line.find('\0'); nul != std::string::npos) {
    skipped_.add_line(where + "a raw NUL byte at byte " + std::to_string(nul + 1) +
                      " (U+0000 must be escaped as \\u0000 in JSON)");
    return false;
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);  // strict: the whole line is one value
  } catch (const nlohmann::json::exception& e) {
    skipped_.add_line(where + "not JSON (" + e.what() + ")");
    return false;
  }
  if (!j.is_object()) {
    skipped_.add_line(where + "not a JSON object; a JSON Lines input holds one object a line");
    return false;
  }
  const auto it = j.find("text");
  if (it == j.end() || !it->is_string()) {
    skipped_.add_line(where + "no string field \"text\"; each line must be {\"text\": \"...\", ...}");
    return false;
  }
  text = it->get<std::string>();
  return true;
}

bool DocumentReader::next(std::string& text) {
  if (!jsonl_) return next_text(text);
  std::string line;
  for (Line got; (got = next_line(line)) != Line::End;) {
    ++line_;
    if (got == Line::TooLong) {
      ++lines_;
      skipped_.add_line(path_ + ":" + std::to_string(line_) + ": longer than --max-line-bytes " +
                        std::to_string(max_line_bytes_) + "; skipped unread");
      continue;
    }
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    ++lines_;
    if (!document_of(line, text)) continue;
    ++documents_;
    return true;
  }
  return false;
}

}  // namespace moe::data
