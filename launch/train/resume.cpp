// Choosing and loading the checkpoint a run continues from.
#include "launch/train/resume.h"

#include <algorithm>

#include "checkpoint/root.h"
#include "core/error.h"
#include "launch/run/run_dir.h"
#include "launch/train/agree.h"
#include "parallel/strings.h"

namespace moe {
namespace {

nlohmann::json value_at(const nlohmann::json& config, const std::string& key) {
  std::string path = "/" + key;
  std::replace(path.begin(), path.end(), '.', '/');
  const nlohmann::json::json_pointer ptr(path);
  return config.contains(ptr) ? config.at(ptr) : nlohmann::json();
}

// A config's value of `key` as the model reads it: model.kv_heads absent (a checkpoint from before the key)
// or 0 is model.heads.
nlohmann::json model_value(const nlohmann::json& config, const std::string& key) {
  nlohmann::json v = value_at(config, key);
  if (key == "model.kv_heads" && (v.is_null() || v == 0)) return value_at(config, "model.heads");
  return v;
}

// The keys that fix the model's parameters: a checkpoint taken with other values cannot be loaded. The
// refusal's text, or "" when it fits.
std::string config_mismatch(const ckpt::Manifest& m, const Config& config, const std::string& dir) {
  std::string diffs;
  for (const char* key :
       {"model.vocab", "model.d_model", "model.layers", "model.heads", "model.kv_heads", "model.ffn_hidden",
        "moe.num_experts", "moe.every", "moe.expert_hidden", "moe.shared_experts"}) {
    const nlohmann::json a = model_value(m.config, key), b = model_value(config.resolved, key);
    if (a != b)
      diffs += std::string(diffs.empty() ? "" : ", ") + key + " = " + a.dump() + " there, " + b.dump() + " here";
  }
  if (diffs.empty()) return "";
  return "checkpoint " + dir + " does not fit this config: " + diffs +
         "; resume with the model it was trained with, or start a new run (--resume none)";
}

void check_checkpoint_fits(const ckpt::Manifest& m, const Config& config, const std::string& dir) {
  const std::string mismatch = config_mismatch(m, config, dir);
  if (!mismatch.empty()) MOE_BAD_INPUT(mismatch);
}

// The manifest of `dir` when it can be read (whether it verifies or not), for the message about its config.
std::optional<ckpt::Manifest> readable_manifest(const std::string& dir) {
  try {
    return ckpt::read_manifest(dir);
  } catch (const Error&) {
    return std::nullopt;
  }
}

// The fitting checkpoint of `--resume auto`: the newest that verifies and holds what the model needs. When
// none does and the newest is of another model config, that is what the user is told.
void choose_auto(const Trainer& t, ResumePoint& point) {
  const Config& config = t.config;
  const std::string root = t.paths.ckpt_root.string();
  if (auto found =
          ckpt::find_newest(root, config.checkpoint.replicas, &point.notes, &point.expected, point.previous_run_id)) {
    point.dir = found->dir;
    check_checkpoint_fits(found->chain.back(), config, point.dir);
    return;
  }
  for (const std::string& dir : ckpt::list_checkpoints(root))
    if (const auto newest = readable_manifest(dir))
      if (newest->run_id.empty() || newest->run_id == point.previous_run_id)
        return check_checkpoint_fits(*newest, config, dir);
}

// `--resume PATH`: that checkpoint, verified against what the model needs, or a refusal naming the reason.
void choose_path(const TrainOptions& options, const Trainer& t, ResumePoint& point) {
  if (const auto m = readable_manifest(options.resume)) check_checkpoint_fits(*m, t.config, options.resume);
  std::string why;
  if (!ckpt::verify_checkpoint(options.resume, t.config.checkpoint.replicas, &why, &point.expected))
    MOE_BAD_INPUT("--resume " << options.resume << ": " << why);
  point.dir = options.resume;
}

// A fresh start in a directory that holds a run: say what is there and what to do.
void check_fresh_start(const TrainOptions& options, const Trainer& t, const ResumePoint& point) {
  try {
    check_run_dir_usable(t.paths.run_dir, options.overwrite);
  } catch (const Error& e) {
    const std::vector<std::string> held = ckpt::list_checkpoints(t.paths.ckpt_root.string());
    if (options.resume == "none" && !held.empty())
      MOE_BAD_INPUT("--run-dir " << t.paths.run_dir << " already holds a run with " << held.size()
                                 << " checkpoint(s) (the newest " << held.front()
                                 << "), and --resume none starts again at step 0: pass --resume auto to continue "
                                    "from the newest checkpoint that verifies, or --overwrite to start again and "
                                    "delete them (or choose another --run-dir)");
    std::string why;
    for (const std::string& note : point.notes) why += "; " + note;
    if (why.empty()) throw;
    MOE_BAD_INPUT(e.message() << " (no checkpoint verifies" << why << ")");
  }
}

// "" when the run may write and delete in every checkpoint root this rank commits to, else why not.
std::string roots_refusal(const Trainer& t, const std::string& run_id) {
  const Config& config = t.config;
  const bool committer = t.leader() || (config.checkpoint.node_local && t.paths.node_leader);
  if (!committer) return "";
  const std::string root = t.paths.ckpt_root.string();
  const auto refusal = [&](const std::string& dir, const std::string& label) {
    return ckpt::root_refusal(ckpt::view_root(dir), label + " (" + dir + ")", run_id,
                              lies_inside(dir, t.paths.run_dir));
  };
  std::string why = refusal(root, "checkpoint.dir");
  for (size_t i = 0; why.empty() && t.leader() && i < config.checkpoint.replicas.size(); ++i)
    why = refusal(config.checkpoint.replicas[i], "checkpoint.replicas[" + std::to_string(i) + "]");
  return why;
}

// Collective: the run directory's recorded id, and every host's checkpoint roots checked against it; the same
// BadInput on every rank when any root is not the run's.
void check_roots(Trainer& t, ResumePoint& point) {
  Communicator& world = *t.groups.world;
  on_rank0_agree(world, [&] {
    check_checkpoint_placement(t.paths.run_dir, t.paths.ckpt_root.string(), t.config.checkpoint);
    point.previous_run_id = recorded_run_id(t.paths.run_dir);
  });
  point.previous_run_id = broadcast_string(world, point.previous_run_id);
  for (const std::string& why : allgather_strings(world, roots_refusal(t, point.previous_run_id)))
    if (!why.empty()) MOE_BAD_INPUT(why);
}

// Rank 0's part: looks at the file system and verifies; `point` is filled on rank 0 only.
void choose_on_rank0(const TrainOptions& options, const Trainer& t, ResumePoint& point) {
  const Config& config = t.config;
  if (config.checkpoint.node_local) {
    if (point.distributed) {
      point.dir = (t.paths.ckpt_root / point.distributed->dir_name).string();
      check_checkpoint_fits(point.distributed->chain.back(), config, point.dir);
    }
  } else if (options.resume == "auto") {
    choose_auto(t, point);
  } else if (options.resume != "none") {
    choose_path(options, t, point);
  }
  if (point.dir.empty()) check_fresh_start(options, t, point);
}

// Every tensor the model restores, with its dtype and global shape: the union over the ranks (collective).
std::vector<ckpt::TensorExpectation> model_expectations(Trainer& t) {
  std::vector<ckpt::TensorExpectation> mine;
  for (const ckpt::Piece& p : checkpoint_pieces(t.state, false))
    mine.push_back({p.tensor, p.dtype, p.slab.global_shape});
  return ckpt::gather_expectations(*t.groups.world, mine);
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
  check_roots(t, point);
  point.expected = model_expectations(t);
  if (node_local && options.resume == "auto")  // collective: every host says what its disk holds
    point.distributed = ckpt::find_newest_distributed(world, t.paths.ckpt_root.string(), t.paths.node_leader,
                                                      &point.notes, &point.expected, point.previous_run_id);
  on_rank0_agree(world, [&] { choose_on_rank0(options, t, point); });
  point.dir = broadcast_string(world, point.dir);
  // A run keeps its id while it continues; a fresh start is a new run, whose checkpoints the old ones are not.
  const bool continues = !point.dir.empty() && !point.previous_run_id.empty();
  point.run_id = broadcast_string(world, continues ? point.previous_run_id : ckpt::new_run_id());
  return point;
}

int64_t load_resume(const ResumePoint& point, Trainer& t) {
  if (point.distributed) {
    ckpt::load_pieces_distributed(*t.groups.world, *point.distributed, checkpoint_pieces(t.state, false));
    finish_load(t.state);
    return point.distributed->chain.back().step;
  }
  std::string why;
  const auto resolved = ckpt::verify_checkpoint(point.dir, t.config.checkpoint.replicas, &why, &point.expected);
  if (!resolved) MOE_FAIL("checkpoint " << point.dir << " verified on rank 0 but not here: " << why);
  ckpt::load_pieces(*resolved, checkpoint_pieces(t.state, false));
  finish_load(t.state);
  return resolved->chain.back().step;
}

}  // namespace moe
