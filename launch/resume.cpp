// Choosing and loading the checkpoint a run continues from.
#include "launch/resume.h"

#include <regex>

#include "core/error.h"
#include "launch/agree.h"
#include "launch/run_dir.h"

namespace moe {
namespace {

// The keys that fix the model's parameters: a checkpoint taken with other values cannot be loaded.
void check_checkpoint_fits(const ckpt::Manifest& m, const Config& config, const std::string& dir) {
  const nlohmann::json& then = m.config;
  const nlohmann::json& now = config.resolved;
  std::string diffs;
  for (const char* key : {"model.vocab", "model.d_model", "model.layers", "model.heads", "model.ffn_hidden",
                          "moe.num_experts", "moe.every", "moe.expert_hidden", "moe.shared_experts"}) {
    const nlohmann::json::json_pointer ptr("/" + std::regex_replace(std::string(key), std::regex("\\."), "/"));
    const nlohmann::json a = then.contains(ptr) ? then.at(ptr) : nlohmann::json(), b = now.at(ptr);
    if (a != b)
      diffs += std::string(diffs.empty() ? "" : ", ") + key + " = " + a.dump() + " there, " + b.dump() + " here";
  }
  if (!diffs.empty())
    MOE_BAD_INPUT("checkpoint " << dir << " does not fit this config: " << diffs
                                << "; resume with the model it was trained with, or start a new run (--resume none)");
}

// Rank 0's part: looks at the file system and verifies; `point` is filled on rank 0 only.
void choose_on_rank0(const TrainOptions& options, const Trainer& t, ResumePoint& point) {
  const Config& config = t.config;
  const std::string root = t.paths.ckpt_root.string();
  if (config.checkpoint.node_local) {
    if (point.distributed) {
      point.dir = (t.paths.ckpt_root / point.distributed->dir_name).string();
      check_checkpoint_fits(point.distributed->chain.back(), config, point.dir);
    }
  } else if (options.resume == "auto") {
    if (auto found = ckpt::find_newest(root, config.checkpoint.replicas, &point.notes)) point.dir = found->dir;
  } else if (options.resume != "none") {
    std::string why;
    if (!ckpt::verify_checkpoint(options.resume, config.checkpoint.replicas, &why))
      MOE_BAD_INPUT("--resume " << options.resume << ": " << why);
    point.dir = options.resume;
  }
  if (point.dir.empty()) {
    try {
      check_run_dir_usable(t.paths.run_dir, options.overwrite);
    } catch (const Error& e) {
      std::string why;
      for (const std::string& note : point.notes) why += "; " + note;
      if (why.empty()) throw;
      MOE_BAD_INPUT(e.message() << " (no checkpoint verifies" << why << ")");
    }
  } else if (!config.checkpoint.node_local) {
    check_checkpoint_fits(ckpt::read_manifest(point.dir), config, point.dir);
  }
}

}  // namespace

ResumePoint choose_resume(const TrainOptions& options, Trainer& t) {
  const bool node_local = t.config.checkpoint.node_local;
  if (node_local && options.resume != "auto" && options.resume != "none")
    MOE_BAD_INPUT("--resume " << options.resume
                              << " with checkpoint.node_local: a checkpoint is spread over the "
                                 "hosts' own disks; use --resume auto (or none)");
  Communicator& world = *t.groups.world;
  ResumePoint point;
  if (node_local && options.resume == "auto")  // collective: every host says what its disk holds
    point.distributed =
        ckpt::find_newest_distributed(world, t.paths.ckpt_root.string(), t.paths.node_leader, &point.notes);
  on_rank0_agree(world, [&] { choose_on_rank0(options, t, point); });
  point.dir = broadcast_string(world, point.dir);
  return point;
}

int64_t load_resume(const ResumePoint& point, Trainer& t) {
  if (point.distributed) {
    ckpt::load_pieces_distributed(*t.groups.world, *point.distributed, checkpoint_pieces(t.state, false));
    finish_load(t.state);
    return point.distributed->chain.back().step;
  }
  std::string why;
  const auto resolved = ckpt::verify_checkpoint(point.dir, t.config.checkpoint.replicas, &why);
  if (!resolved) MOE_FAIL("checkpoint " << point.dir << " verified on rank 0 but not here: " << why);
  ckpt::load_pieces(*resolved, checkpoint_pieces(t.state, false));
  finish_load(t.state);
  return resolved->chain.back().step;
}

}  // namespace moe
