// The inputs of `moe prep`: the files an input path names, and their documents read one at a time
// (docs/data.md "Inputs"). Plain text, or JSON Lines with a "text" field; either may be gzip-compressed.
// What cannot be read is skipped and counted (SkippedInputs) up to bounds the user sets (InputBound).
// Not here: what is done with a document (prep.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace moe::data {

// Longest JSON Lines line read (--max-line-bytes); a longer one is skipped without being held whole.
inline constexpr int64_t kDefaultMaxLineBytes = int64_t(64) << 20;

// The regular files under `path` (itself when a file), sorted by path; hidden names skipped. Entries of
// a directory that are not regular files (FIFOs, devices, sockets, dangling or looping links) are not
// listed but appended to `not_regular`, when given, as "PATH: what it is", sorted. Throws BadInput when
// the path does not exist, is neither a regular file nor a directory, or the directory holds no entry.
std::vector<std::string> list_input_files(const std::string& path, std::vector<std::string>* not_regular = nullptr);

// True for names ending in .jsonl, .ndjson or .json, each optionally followed by .gz.
bool is_jsonl_name(const std::string& path);

// How many bad files (or lines) may be skipped: a count, or a percentage of all the files (or lines) read.
struct InputBound {
  double value = 0.1;
  bool percent = true;
  // The most that may be skipped of `total`.
  int64_t allowed(int64_t total) const;
  // "10" or "0.1%".
  std::string text() const;
};
// "N" (an integer >= 0) or "P%" (0 <= P <= 100); BadInput naming `option` otherwise.
InputBound parse_input_bound(const std::string& text, const std::string& option);

// What was skipped: whole files and JSON Lines lines, counted, the first few named with the reason.
struct SkippedInputs {
  static constexpr size_t kNamed = 5;
  int64_t files = 0, lines = 0;
  std::vector<std::string> named_files;  // "PATH: reason"
  std::vector<std::string> named_lines;  // "PATH:LINE: reason"
  void add_file(const std::string& note);
  void add_line(const std::string& note);
};

// Reads one file's documents. A JSON Lines file gives one per non-blank line (its "text" string, which
// may hold any character, \u0000 included); a line that is not a JSON object with a string "text" (a raw
// NUL byte in it, trailing bytes, invalid UTF-8...) or is longer than max_line_bytes is skipped and
// counted, never cut. A plain text file is read as bytes (NUL included, as token 0 for the byte
// tokenizer) and is one document, cut at the first line end after every `max_document_bytes` so memory
// stays bounded. gzip is recognised by its magic bytes, whatever the name.
class DocumentReader {
 public:
  // Throws BadInput naming the file when it is not a regular file or cannot be opened.
  DocumentReader(const std::string& path, int64_t max_document_bytes, int64_t max_line_bytes = kDefaultMaxLineBytes);
  ~DocumentReader();
  DocumentReader(const DocumentReader&) = delete;
  DocumentReader& operator=(const DocumentReader&) = delete;
  // The next document into `text`; false at the end. Throws BadInput naming the file for a damaged
  // gzip stream or a failed read.
  bool next(std::string& text);
  // Bytes of the file consumed so far (compressed bytes for gzip), for progress.
  int64_t consumed() const;
  // JSON Lines: the non-blank lines read, and those skipped (the first few named in `skipped`).
  int64_t lines() const { return lines_; }
  int64_t documents() const { return documents_; }
  const SkippedInputs& skipped() const { return skipped_; }

 private:
  enum class Line { End, Whole, TooLong };
  bool fill();
  Line next_line(std::string& line);
  bool next_text(std::string& text);
  bool document_of(const std::string& line, std::string& text);
  struct Gz;
  std::unique_ptr<Gz> gz_;
  std::string path_;
  bool jsonl_;
  int64_t max_document_bytes_, max_line_bytes_;
  std::vector<char> buffer_;  // JSON Lines: bytes read, [begin_, end_) not yet taken
  size_t begin_ = 0, end_ = 0;
  int64_t line_ = 0, lines_ = 0, documents_ = 0;
  SkippedInputs skipped_;
  std::string pending_;  // plain text read past the end of the last document
  bool eof_ = false;
};

}  // namespace moe::data
