// The inputs of `moe prep`: the files an input path names, and their documents read one at a time
// (docs/data.md "Inputs"). Plain text, or JSON Lines with a "text" field; either may be gzip-compressed.
// Not here: what is done with a document (prep.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace moe::data {

// The regular files under `path` (itself when a file), sorted by path; hidden names skipped. Throws
// BadInput when the path does not exist or holds no file.
std::vector<std::string> list_input_files(const std::string& path);

// True for names ending in .jsonl, .ndjson or .json, each optionally followed by .gz.
bool is_jsonl_name(const std::string& path);

// Reads one file's documents. A JSON Lines file gives one per non-blank line (its "text" string); a
// plain text file is one document, cut at the first line end after every `max_document_bytes` so
// memory stays bounded. gzip is recognised by its magic bytes, whatever the name.
class DocumentReader {
 public:
  DocumentReader(const std::string& path, int64_t max_document_bytes);
  ~DocumentReader();
  DocumentReader(const DocumentReader&) = delete;
  DocumentReader& operator=(const DocumentReader&) = delete;
  // The next document into `text`; false at the end. Throws BadInput naming the file (and line) for
  // a line that is not a JSON object with a string "text", or a damaged gzip stream.
  bool next(std::string& text);
  // Bytes of the file consumed so far (compressed bytes for gzip), for progress.
  int64_t consumed() const;

 private:
  bool next_line(std::string& line);
  bool next_text(std::string& text);
  struct Gz;
  std::unique_ptr<Gz> gz_;
  std::string path_;
  bool jsonl_;
  int64_t max_document_bytes_;
  int64_t line_ = 0;
  std::string pending_;  // plain text read past the end of the last document
  bool eof_ = false;
};

}  // namespace moe::data
