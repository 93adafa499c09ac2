// Fault injection.
#include "launch/train/faults.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "checkpoint/checkpointer.h"
#include "core/error.h"

namespace moe {
namespace fs = std::filesystem;

FaultInjector::FaultInjector(std::vector<FaultInjection> faults, int64_t rank, std::string run_dir,
                             std::string checkpoint_root)
    : faults_(std::move(faults)),
      rank_(rank),
      run_dir_(std::move(run_dir)),
      checkpoint_root_(std::move(checkpoint_root)) {}

bool FaultInjector::any_for_this_rank() const {
  for (const FaultInjection& f : faults_)
    if (f.rank == rank_) return true;
  return false;
}

namespace {

// Flips one byte in the middle of the newest committed checkpoint's first shard.
void corrupt_newest_checkpoint(const std::string& root) {
  const std::vector<std::string> dirs = ckpt::list_checkpoints(root);
  if (dirs.empty()) return;
  const fs::path shard = fs::path(dirs.front()) / "rank-00000.h5";
  std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
  if (!f) return;
  f.seekg(0, std::ios::end);
  const std::streamoff size = f.tellg();
  f.seekg(size / 2);
  char c = 0;
  f.read(&c, 1);
  c = char(c ^ 0x5a);
  f.seekp(size / 2);
  f.write(&c, 1);
  f.close();
  std::fprintf(stderr, "moe: fault injection: corrupted %s\n", shard.c_str());
}

}  // namespace

void FaultInjector::after_step(int64_t done) {
  for (size_t i = 0; i < faults_.size(); ++i) {
    const FaultInjection& f = faults_[i];
    if (f.rank != rank_ || f.step != done) continue;
    // Record before firing: the marker is what keeps a restarted job from firing it again.
    const fs::path dir = fs::path(run_dir_) / "faults";
    std::error_code ec;
    fs::create_directories(dir, ec);
    const fs::path marker = dir / ("fired-" + std::to_string(i) + "-" + to_string(f.kind) + "-rank" +
                                   std::to_string(f.rank) + "-step" + std::to_string(f.step));
    const int fd = ::open(marker.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
    if (fd < 0) continue;  // fired before this restart
    ::fsync(fd);
    ::close(fd);
    std::fprintf(stderr, "moe: fault injection: %s on rank %lld after step %lld\n", to_string(f.kind).c_str(),
                 static_cast<long long>(rank_), static_cast<long long>(done));
    std::fflush(stderr);
    switch (f.kind) {
      case FaultKind::Kill:
        ::raise(SIGKILL);
        break;
      case FaultKind::Stop:
        ::raise(SIGSTOP);
        break;
      case FaultKind::Hang:
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // heartbeats go on; progress does not
      case FaultKind::Exception:
        MOE_FAIL("injected exception after step " << done << " on rank " << rank_);
      case FaultKind::CorruptCheckpoint:
        corrupt_newest_checkpoint(checkpoint_root_);
        ::raise(SIGKILL);
        break;
      case FaultKind::FreezeAlltoall:
      case FaultKind::MismatchAlltoall:
        if (recorder_)
          recorder_->arm(
              f.kind == FaultKind::FreezeAlltoall ? FlightFault::FreezeInAlltoall : FlightFault::MismatchAlltoall,
              "ep");
        break;
    }
  }
}

}  // namespace moe
