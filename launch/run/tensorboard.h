// TensorBoard event files of a run (docs/metrics.md "TensorBoard"): every metrics.jsonl line becomes one event
// at its step, its numbers as scalars and each MoE layer's expert load as a histogram, in RUN_DIR/tensorboard/.
// Each start of the run writes a new events file that opens with a session start at the first step it trains,
// so TensorBoard drops what a crashed start wrote past the checkpoint and the curve stays one series.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "launch/run/event_file.h"

namespace moe {

// The summary of one metrics.jsonl line (training or evaluation): a scalar per number in it, tagged by where
// it is (docs/metrics.md "TensorBoard"), and a histogram over expert index of each MoE layer's
// tokens_per_expert. "step" and "alerts" are not charted; nulls and booleans are skipped.
tensorboard::Summary line_summary(const nlohmann::json& line);

// RUN_DIR/tensorboard: refuses (BadInput naming it) anything there but a real directory or nothing.
void check_tensorboard_dir(const std::filesystem::path& run_dir);
// Removes the events files this program wrote in RUN_DIR/tensorboard (a fresh start; nothing else there).
void clear_tensorboard(const std::filesystem::path& run_dir);

class TensorBoardWriter {
 public:
  // A new events file in RUN_DIR/tensorboard, named to sort after every earlier one, opening with the file
  // version and a session start at step start_step + 1.
  TensorBoardWriter(const std::filesystem::path& run_dir, int64_t start_step);
  // One event at the line's step, flushed.
  void write(const nlohmann::json& line);
  const std::filesystem::path& path() const { return file_->path(); }

 private:
  std::unique_ptr<EventFile> file_;
};

}  // namespace moe
