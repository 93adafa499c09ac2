// TFRecord files of TensorBoard events: each record is the data's length (uint64, little-endian), the masked
// CRC-32C of those 8 bytes, the data (a serialised tensorboard.Event), and the masked CRC-32C of the data;
// the format TensorFlow's record writer and TensorBoard's readers share (tensorflow/core/lib/io/record_writer.cc,
// tensorboard/compat/tensorflow_stub/pywrap_tensorflow.py). A reader stops at the first record cut short or
// failing its checksum, so a file cut by a crash reads up to the damage.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>

#include "tensorboard_event.pb.h"

namespace moe {

// CRC-32C (Castagnoli; Boost.CRC) of `bytes`.
uint32_t crc32c(std::string_view bytes);
// The CRC as TFRecord stores it: rotated right by 15 bits plus 0xa282ead8, so that a CRC over bytes that
// themselves hold CRCs does not degenerate.
uint32_t masked_crc32c(std::string_view bytes);
// One record framing `data`.
std::string tfrecord(std::string_view data);

// A new events file, created exclusively (never over anything), each event appended and flushed as one
// record. A failed write is a RunFailed naming the file.
class EventFile {
 public:
  explicit EventFile(const std::filesystem::path& path);
  ~EventFile();
  EventFile(const EventFile&) = delete;
  EventFile& operator=(const EventFile&) = delete;
  void write(const tensorboard::Event& event);
  const std::filesystem::path& path() const { return path_; }

 private:
  std::FILE* file_ = nullptr;
  std::filesystem::path path_;
};

}  // namespace moe
