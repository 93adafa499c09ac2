// Saving and restoring the training state in global coordinates.
//
// Save: at a step boundary every rank hands the pieces it writes to a writer thread, which owns every
// HDF5 call while a save is in flight. The writer first copies the pieces into host buffers kept from
// earlier saves, counting the values that are not finite as it goes (the snapshot; asynchronous: while
// training goes on, see wait_snapshot), then XORs the delta pieces, writes ROOT/tmp-step-N/rank-R.h5, fsyncs it
// and checksums it. The ranks agree on the count on the caller's thread (wait_snapshot, commit): a snapshot
// with any value that is not finite is never committed. Each step every rank polls: once all
// ranks' files are on disk, rank 0 writes the manifest, renames the directory to ROOT/step-N (the commit), updates
// ROOT/latest, deletes chains beyond checkpoint.keep and copies the checkpoint to the replica roots. A crash at any
// moment leaves either the previous or the new checkpoint as the newest complete one. Saves between full ones hold only
// the XOR of each tensor's bits with the previous save's (compressed by HDF5's shuffle and deflate; how much depends on
// how many bits changed, docs/bench.md), restored bit-exactly along the chain.
//
// Restore: the newest checkpoint whose manifest and files verify (size and xxh64), falling back to a
// replica's copy of a file, then to an older checkpoint, saying which and why; each rank reads the
// ranges it needs from whichever files hold them, so any layout can load any other's checkpoint.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/manifest.h"
#include "checkpoint/verify.h"
#include "parallel/communicator.h"

namespace moe::ckpt {

// A part of a global tensor, as a rank holds it: a hyperslab (this rank's block of a split tensor, or the
// whole tensor) and a range of its row-major order (a ZeRO slice; all of it otherwise). src and dst hold
// slab.count elements in that order.
struct Piece {
  std::string tensor;  // global name, e.g. "params/layers.0.attn.wq"
  DType dtype = DType::F32;
  Slab slab;                  // where its elements lie in the global tensor (slab.h)
  const void* src = nullptr;  // save: the values now
  void* dst = nullptr;        // restore: where they go
  int64_t count() const { return slab.count; }
  int64_t bytes() const;
};

// A snapshot the ranks found values that are not finite in (NaN or infinity, in F32 and F64 pieces).
struct NonFiniteSnapshot {
  int64_t step = 0;
  int64_t count = 0;         // over all ranks
  std::string first_tensor;  // the first piece of this rank's that holds one ("" when none does)
};

struct SaveSettings {
  std::string root;        // the checkpoint directory (run_dir/checkpoints)
  int64_t keep = 2;        // complete chains kept
  int64_t full_every = 1;  // a full checkpoint every this many saves, deltas between
  bool async = true;
  std::vector<std::string> replicas;  // further roots receiving a full copy of every checkpoint
  // Each rank's file is also kept by another rank (peer-of-rank-R.h5): the rank local_ranks further on,
  // on another host when ranks fill hosts in order, or the next rank when all share one host.
  bool peer_copy = false;
  int64_t local_ranks = 1;  // ranks per host
  // Node-local roots: `root` is on this host's own disk (ranks fill hosts in order, local_ranks per host).
  // Every host's first rank commits the same manifest into its own root; restoring goes through
  // find_newest_distributed / load_pieces_distributed.
  bool node_local = false;
  // Tests: the writer thread waits this long before it takes an asynchronous save's snapshot, so that
  // training reaches its next update first (the trainer sets it from MOE_TEST_SNAPSHOT_DELAY_MS).
  double snapshot_delay_s = 0;
  // Tests: the committer waits this long before it copies a checkpoint to each replica root, standing in for a slow
  // file system (the trainer sets it from MOE_TEST_REPLICA_DELAY_MS).
  double replica_delay_s = 0;
  // Called on every rank once the save of a snapshot holding values that are not finite has been abandoned
  // (its temporary directory removed, nothing committed); it is expected to throw (the trainer: RunFailed
  // saying what to do). Without it, or when it returns, the checkpointer throws RunFailed.
  std::function<void(const NonFiniteSnapshot&)> on_non_finite;
};

class Checkpointer {
 public:
  // run_info: "config", "layout", "versions" and "data" (provenance) for the manifest. log: where events go (rank 0).
  Checkpointer(SaveSettings settings, Communicator& world, nlohmann::json run_info,
               std::function<void(const std::string&)> log);
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Collective. Waits for a save still in flight (at most one), then snapshots `pieces` and writes them:
  // in the background when async, else now, committing before it returns. Returns the seconds the
  // caller was held up (the stall; async: without the snapshot, which the writer thread takes).
  //
  // The snapshot contract (async): save() returns before the values are copied; the writer thread reads
  // every piece's src until the snapshot is taken. Until then the caller must not change, free or move
  // any memory a piece points at: call wait_snapshot() before the first such change. The trainer does so
  // at one place, TrainState's wait_for_snapshot (launch/train/train_state.h), which the step calls before its
  // update (clipping, optimizer, ZeRO all-gather, routing state) and which checkpoint_pieces calls before
  // it restages anything for the next save.
  //
  // Values that are not finite: the writer counts them while it copies; the first wait_snapshot, poll or
  // finish after the save (whichever comes first; sync: save itself, before writing) agrees on the count
  // over the ranks and, if any, abandons the save and calls on_non_finite (SaveSettings), which throws.
  double save(int64_t step, const std::vector<Piece>& pieces);
  // Collective the first time after an asynchronous save (all ranks call it at the same point; later calls
  // for the same save return at once): returns once the snapshot of the save in flight is taken on this
  // rank and the ranks agreed that it is finite (throws otherwise, see save); the seconds waited, also
  // added to that save's stall_s. At once when none is in flight, or sync.
  double wait_snapshot();
  // Collective; call at every step boundary. Commits the save in flight once every rank has written
  // (first waiting for this rank's snapshot and agreeing on it, as wait_snapshot, if that was not done).
  void poll();
  // Collective: waits for the save in flight and commits it.
  void finish();
  // Whether a save is in flight: the next poll or finish may commit it. A commit returns on every rank together
  // (the ranks that write no manifest wait for those that do, their peer and replica copies included), so the
  // caller times it as checkpoint work, not as the step's (the trainer's heartbeat phase).
  bool in_flight() const { return job_ != nullptr; }

  // Figures of the last committed save, for metrics and benchmarks.
  struct Report {
    int64_t step = -1;
    std::string kind;
    double stall_s = 0, write_s = 0;
    int64_t bytes = 0;  // all files of the checkpoint
  };
  const Report& last_report() const { return report_; }
  // The step of the newest save that failed (-1: none) and why; a later committed save supersedes it.
  int64_t last_failed_step() const { return failed_step_; }
  const std::string& last_failure() const { return failure_; }

 private:
  struct Job;
  void start_job(std::unique_ptr<Job> job);
  void check_snapshot(Job& job);
  [[noreturn]] void abandon_non_finite(Job& job, int64_t count);
  void commit(Job& job, bool wait);
  void keep_buffers(Job& job, bool written);
  void apply_retention(const std::string& root);
  bool committer() const;  // writes manifests and renames: rank 0, or every host's first rank
  FileEntry copy_to_peer(const Job& job);

  SaveSettings s_;
  Communicator& world_;
  nlohmann::json run_info_;
  std::function<void(const std::string&)> log_;
  std::unique_ptr<Job> job_;
  // Bits of the last committed save, per piece (tensor@slab), for deltas; and a second buffer per piece
  // from before, which the next snapshot is copied into (no fresh memory, so no page faults).
  std::map<std::string, std::vector<uint8_t>> previous_, spare_;
  std::vector<std::string> chain_;  // directories of the current chain
  int64_t saves_ = 0;
  Report report_;
  int64_t failed_step_ = -1;
  std::string failure_;
};

// ---- Restore ------------------------------------------------------------------------------------

struct Resolved {
  std::string dir;              // the checkpoint directory chosen
  std::vector<Manifest> chain;  // base first, this one last
  std::vector<std::string> chain_dirs;
  // For each manifest of the chain, the path of each of its files (after fallbacks), "" if unusable.
  std::vector<std::vector<std::string>> paths;
  std::vector<std::string> notes;  // fallbacks taken and why
};

// The one verification of a checkpoint, for `moe ckpt` and `--resume` alike (verify.h, docs/checkpoint.md):
// dir and the chain it needs. Manifests readable and consistent (format, kind, step = the directory's and
// the chain's, chain_manifests, file names confined to the directory); every file a regular file of its
// size and xxh64 (or a verified copy in a replica root or a peer copy); every HDF5 file holding exactly the
// datasets listed with their dtype, shape and range; every tensor covered exactly once, the same tensors
// along the chain. With `expected` (what a resuming run needs): exactly those tensors, with those dtypes
// and global shapes. nullopt with `why` when it does not verify.
std::optional<Resolved> verify_checkpoint(const std::string& dir, const std::vector<std::string>& replica_roots,
                                          std::string* why, const std::vector<TensorExpectation>* expected = nullptr);
// The newest checkpoint under root (step-* directories, newest first) that verifies; notes say what
// was skipped and why. nullopt when there is none. With `run_id`, only checkpoints of that run (or of no
// recorded run, written before run ids) are taken; another run's are skipped with a note.
std::optional<Resolved> find_newest(const std::string& root, const std::vector<std::string>& replica_roots,
                                    std::vector<std::string>* notes,
                                    const std::vector<TensorExpectation>* expected = nullptr,
                                    const std::optional<std::string>& run_id = std::nullopt);
// Committed checkpoint directories under root, newest step first.
std::vector<std::string> list_checkpoints(const std::string& root);
// Fills every piece's dst from the checkpoint (and its chain). BadInput when a range is not in it.
void load_pieces(const Resolved& checkpoint, const std::vector<Piece>& pieces);

// ---- Restore from node-local roots (collective) ----------------------------------------------------

struct DistributedChoice {
  std::string dir_name;                        // e.g. "step-00000010"
  std::vector<Manifest> chain;                 // base first
  std::vector<std::vector<int64_t>> holder;    // per chain member, per file entry: the rank that reads it (-1: none)
  std::vector<std::vector<std::string>> path;  // the same, the path on that rank (meaningful there only)
  std::vector<std::string> notes;
};
// Each host's first rank (node_leader) verifies what its own root holds; all ranks agree on the newest
// checkpoint whose every file (or its peer copy) is held by some host, along its whole chain (`run_id` as for
// find_newest).
// Each host's files pass check_manifest, check_file and check_shard (verify.h) on that host.
std::optional<DistributedChoice> find_newest_distributed(Communicator& world, const std::string& local_root,
                                                         bool node_leader, std::vector<std::string>* notes,
                                                         const std::vector<TensorExpectation>* expected = nullptr,
                                                         const std::optional<std::string>& run_id = std::nullopt);
// Every rank asks the holders for the ranges its pieces need; the holders read them and send them back.
void load_pieces_distributed(Communicator& world, const DistributedChoice& choice, const std::vector<Piece>& pieces);

}  // namespace moe::ckpt
