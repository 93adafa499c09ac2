// Who a checkpoint root belongs to, and the only deletions the program makes in one (docs/checkpoint.md,
// "What the program deletes"). A root belongs to one run: ROOT/owner.json names the run's id. Inside a root
// that belongs to the run, and nowhere else, the program deletes entries it recognises as its own: committed
// checkpoints (step-N directories holding manifest.json), saves cut off (tmp-step-N), `latest`. Anything
// else in a root (a user's files, another run's root, the run directory itself) makes the root refused.
#pragma once

#include <string>
#include <vector>

namespace moe::ckpt {

inline constexpr const char* kOwnerName = "owner.json";
// ROOT/latest: one line, the name of the newest committed checkpoint. Informational: resuming verifies the
// checkpoints themselves and never trusts it. Written and read here only.
inline constexpr const char* kLatestName = "latest";

struct RootOwner {
  std::string run_id;   // 16 hex digits, made at the run's fresh start (new_run_id)
  std::string run_dir;  // the run directory when it last started: for messages only
};

// What a root holds, looked at without following a symbolic link.
struct RootView {
  bool exists = false;
  bool has_owner = false;            // owner.json present and readable
  RootOwner owner;                   // when has_owner
  std::vector<std::string> ours;     // entries the program recognises as its own (never owner.json)
  std::vector<std::string> foreign;  // entries it does not (at most a few, sorted), or why it is not a root
};
RootView view_root(const std::string& root);

// "" when run `run_id` may write and delete in `root`, else why not, starting with `label`. Allowed: a root
// that does not exist or is empty; one whose owner.json names run_id (non-empty); one without owner.json
// holding only the program's entries, when `unowned_is_ours` (a root inside the run's own directory, written
// before owner.json existed). `run_id` "" is a run that has no id yet (a new run directory).
std::string root_refusal(const RootView& view, const std::string& label, const std::string& run_id,
                         bool unowned_is_ours);

// Deletes the entries view_root recognises as the program's own (a fresh start: they must never be resumed).
// Call it only for a root root_refusal allowed. Symbolic links are removed, never followed.
void clear_root(const std::string& root);
// Writes ROOT/owner.json, creating ROOT, through a temporary file (O_EXCL, no symbolic link followed) and a rename.
void write_owner(const std::string& root, const RootOwner& owner);
// Replaces ROOT/latest with `name` (a temporary file, fsync, rename, fsync of the root).
void write_latest(const std::string& root, const std::string& name);
// The name ROOT/latest holds ("" when there is no such regular file).
std::string read_latest(const std::string& root);
// A new run id: 16 hex digits from the system's random source.
std::string new_run_id();

}  // namespace moe::ckpt
