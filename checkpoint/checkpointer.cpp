// The checkpoint writer (snapshot, background write, collective commit, retention, replicas).
#include "checkpoint/checkpointer.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <utility>

#include "checkpoint/detail.h"
#include "checkpoint/root.h"
#include "core/error.h"
#include "core/host.h"
#include "parallel/strings.h"

namespace moe::ckpt {
namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using detail::dtype_size;
using detail::peer_file_name;
using detail::step_of_dir;

namespace detail {

size_t dtype_size(DType t) { return t == DType::F64 || t == DType::I64 ? 8 : 4; }

int64_t step_of_dir(const std::string& name) { return name.rfind("step-", 0) == 0 ? std::atoll(name.c_str() + 5) : -1; }

std::string peer_file_name(int64_t rank) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "peer-of-rank-%05lld.h5", static_cast<long long>(rank));
  return buf;
}

}  // namespace detail

namespace {

void remove_later_than(const std::string& root, int64_t step) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return;
  for (const auto& entry : fs::directory_iterator(root, ec))
    if (entry.is_directory() && step_of_dir(entry.path().filename().string()) > step) fs::remove_all(entry.path(), ec);
}

void copy_directory(const fs::path& from, const fs::path& to) {
  fs::create_directories(to);
  for (const auto& entry : fs::directory_iterator(from))
    fs::copy_file(entry.path(), to / entry.path().filename(), fs::copy_options::overwrite_existing);
}

// Copies n values of Bits from src to dst and returns how many are not finite (an exponent of all ones is an
// infinity or a NaN): block by block, each counted while it is still in cache, with bit tests the compiler
// vectorises.
template <typename Bits>
int64_t copy_counting_non_finite(void* dst, const void* src, int64_t n, Bits exponent) {
  constexpr int64_t kBlock = 4096;
  auto* out = static_cast<unsigned char*>(dst);
  const auto* in = static_cast<const unsigned char*>(src);
  int64_t bad = 0;
  for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
    const int64_t i1 = std::min<int64_t>(n, i0 + kBlock);
    std::memcpy(out + i0 * int64_t(sizeof(Bits)), in + i0 * int64_t(sizeof(Bits)), size_t(i1 - i0) * sizeof(Bits));
    uint32_t block = 0;
    for (int64_t i = i0; i < i1; ++i) {
      Bits w;
      std::memcpy(&w, out + i * int64_t(sizeof(Bits)), sizeof(Bits));
      block += (w & exponent) == exponent;
    }
    bad += block;
  }
  return bad;
}

// A piece's values into dst; returns how many are not finite (floating-point pieces only).
int64_t copy_piece(void* dst, const Piece& p) {
  if (p.dtype == DType::F32) return copy_counting_non_finite<uint32_t>(dst, p.src, p.count(), 0x7f800000u);
  if (p.dtype == DType::F64) return copy_counting_non_finite<uint64_t>(dst, p.src, p.count(), 0x7ff0000000000000ull);
  if (p.bytes() > 0) std::memcpy(dst, p.src, size_t(p.bytes()));
  return 0;
}

}  // namespace

int64_t Piece::bytes() const { return count() * int64_t(dtype_size(dtype)); }

// One save in flight: the snapshot, and what the writer thread reports.
struct Checkpointer::Job {
  int64_t step = 0;
  std::string kind;
  std::vector<std::string> chain;
  fs::path tmp_dir, final_dir;
  struct Snap {
    Piece piece;  // src: the live values, read by take_snapshot only
    std::string dataset, key;
    bool xor_delta = false;
    std::vector<uint8_t> raw;   // the values at the step (a buffer of an earlier save, reused)
    std::vector<uint8_t> prev;  // xor_delta: the previous save's values, then their XOR with raw
    const std::vector<uint8_t>& bits() const { return xor_delta ? prev : raw; }
  };
  std::vector<Snap> snaps;
  std::thread writer;
  std::atomic<int> state{0};  // 0 writing, 1 written, 2 failed
  std::string error;
  FileEntry entry;
  double stall_s = 0, write_s = 0;
  // Set once every piece's values are in `raw` (or the copy failed): the live memory is free to change,
  // and non_finite and first_non_finite are this rank's.
  std::atomic<bool> snapped{false};
  std::mutex snap_mutex;
  std::condition_variable snap_cv;
  int64_t non_finite = 0;              // values of this rank's snapshot that are not finite
  std::string first_non_finite;        // the tensor of the first of them
  bool checked = false;                // the ranks agreed the snapshot is finite (check_snapshot; caller's thread)
  std::atomic<bool> abandoned{false};  // the save will never be committed: the writer stops
  Clock::time_point started;           // the writer's start (write_s)
  void mark_snapped() {
    {
      std::lock_guard<std::mutex> lock(snap_mutex);
      snapped = true;
    }
    snap_cv.notify_all();
  }
  // The writer's first act: every piece's values into its buffer (after the first saves, memory already
  // touched, so the copy takes no page faults), counting those that are not finite on the way. Then the
  // live memory is released (mark_snapped), whatever happened.
  void take_snapshot(double delay_s) {
    started = Clock::now();
    try {
      if (delay_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(delay_s));
      for (Snap& s : snaps) {
        s.raw.resize(size_t(s.piece.bytes()));
        const int64_t bad = copy_piece(s.raw.data(), s.piece);
        if (bad > 0 && first_non_finite.empty()) first_non_finite = s.piece.tensor;
        non_finite += bad;
        s.piece.src = nullptr;
      }
    } catch (const std::exception& e) {
      error = e.what();
      state = 2;
    }
    mark_snapped();
  }
  void xor_deltas() {
    for (Snap& s : snaps)
      if (s.xor_delta)
        for (size_t i = 0; i < s.raw.size(); ++i) s.prev[i] ^= s.raw[i];
  }
  void write_file(int64_t rank);
};

// After the snapshot: the XOR of the delta pieces, then this rank's file, fsynced and checksummed. Nothing is
// written when the snapshot failed or holds values that are not finite (it will not be committed); the
// writing stops when the save is abandoned meanwhile.
void Checkpointer::Job::write_file(int64_t rank) {
  if (state != 0) return;
  try {
    if (non_finite > 0) MOE_FAIL(non_finite << " values not finite (first in " << first_non_finite << ")");
    xor_deltas();
    const fs::path path = tmp_dir / rank_file_name(rank);
    {
      ShardWriter writer(path.string());
      writer.set_attribute("step", std::to_string(step));
      writer.set_attribute("kind", kind);
      for (const Snap& s : snaps) {
        if (abandoned) MOE_FAIL("the save was abandoned");
        if (s.xor_delta) {
          // Stored as 32-bit words: in the file, a 64-bit tensor has a trailing axis of 2 words (the
          // manifest keeps elements).
          const int64_t words = int64_t(dtype_size(s.piece.dtype) / 4);
          writer.write(s.dataset, DType::U32, s.bits().data(), s.piece.slab.in_words(words), /*compress=*/true);
        } else {
          writer.write(s.dataset, s.piece.dtype, s.bits().data(), s.piece.slab);
        }
        entry.datasets.push_back({s.dataset, s.piece.tensor, s.piece.dtype, s.piece.slab, s.xor_delta});
      }
      writer.close();  // flush and fsync
    }
    entry.name = rank_file_name(rank);
    entry.rank = rank;
    entry.xxh64 = file_xxh64(path.string(), &entry.size);
    write_s = std::chrono::duration<double>(Clock::now() - started).count();
    state = 1;
  } catch (const std::exception& e) {
    error = e.what();
    state = 2;
  }
}

namespace {

// The buffer kept under `key` in `pool` (empty when none), removed from it.
std::vector<uint8_t> take_buffer(std::map<std::string, std::vector<uint8_t>>& pool, const std::string& key) {
  auto it = pool.find(key);
  if (it == pool.end()) return {};
  std::vector<uint8_t> out = std::move(it->second);
  pool.erase(it);
  return out;
}

}  // namespace

Checkpointer::Checkpointer(SaveSettings settings, Communicator& world, json run_info,
                           std::function<void(const std::string&)> log)
    : s_(std::move(settings)), world_(world), run_info_(std::move(run_info)), log_(std::move(log)) {}

Checkpointer::~Checkpointer() {
  if (job_ && job_->writer.joinable()) job_->writer.join();  // never leave the thread running
}

double Checkpointer::save(int64_t step, const std::vector<Piece>& pieces) {
  const auto t0 = Clock::now();
  finish();  // at most one save in flight
  auto job = std::make_unique<Job>();
  job->step = step;
  const bool full = saves_ % std::max<int64_t>(1, s_.full_every) == 0 || chain_.empty();
  job->kind = full ? "full" : "delta";
  if (full) chain_.clear();
  chain_.push_back(checkpoint_name(step));
  job->chain = chain_;
  ++saves_;
  job->final_dir = fs::path(s_.root) / checkpoint_name(step);
  job->tmp_dir = fs::path(s_.root) / ("tmp-" + checkpoint_name(step));

  // What the writer snapshots (take_snapshot): each piece into a buffer of an earlier save, a delta piece
  // beside the previous save's values, which the writer turns into the XOR with the new ones.
  std::map<std::string, int> names;
  for (const Piece& p : pieces) {
    Job::Snap snap;
    snap.piece = p;
    const int n = names[p.tensor]++;
    snap.dataset = n == 0 ? p.tensor : p.tensor + "#" + std::to_string(p.slab.first_global_index());
    snap.key = p.tensor + "@" + p.slab.text();
    snap.raw = take_buffer(spare_, snap.key);
    snap.prev = take_buffer(previous_, snap.key);  // a full save does not need it: kept for reuse
    if (!full && snap.prev.size() == size_t(p.bytes()))
      snap.xor_delta = true;
    else if (snap.raw.capacity() < snap.prev.capacity())
      std::swap(snap.raw, snap.prev);
    job->snaps.push_back(std::move(snap));
  }
  previous_.clear();  // pieces this save does not have

  // The temporary directory exists before any rank writes into it (on every host with node-local roots).
  if (committer()) {
    std::error_code ec;
    fs::remove_all(job->tmp_dir, ec);
    fs::create_directories(job->tmp_dir, ec);
    if (ec) MOE_FAIL("cannot create checkpoint directory " << job->tmp_dir.string() << ": " << ec.message());
  }
  world_.barrier();
  job->stall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  start_job(std::move(job));
  if (!s_.async) finish();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void Checkpointer::start_job(std::unique_ptr<Job> job) {
  job_ = std::move(job);
  Job* j = job_.get();
  const int64_t rank = world_.rank();
  if (s_.async) {
    const double delay_s = s_.snapshot_delay_s;
    j->writer = std::thread([j, rank, delay_s] {
      j->take_snapshot(delay_s);
      j->write_file(rank);
    });
    return;
  }
  j->take_snapshot(0);
  check_snapshot(*j);  // agreed before anything is written
  j->write_file(rank);
}

// Collective, once per save: waits for this rank's snapshot; then the ranks agree on the count of values that
// are not finite (the writer threads make no MPI calls: the world is initialised FUNNELED).
void Checkpointer::check_snapshot(Job& job) {
  if (job.checked) return;
  if (!job.snapped) {
    std::unique_lock<std::mutex> lock(job.snap_mutex);
    job.snap_cv.wait(lock, [&] { return job.snapped.load(); });
  }
  job.checked = true;
  int64_t count = job.non_finite;
  world_.allreduce_sum(&count, 1);
  if (count > 0) abandon_non_finite(job, count);
}

// Every rank: the writer stopped, the temporary directory removed (nothing of this step is committed, the
// committed checkpoints stay as they are), the next save a new full chain; then on_non_finite.
void Checkpointer::abandon_non_finite(Job& job, int64_t count) {
  const NonFiniteSnapshot found{job.step, count, job.first_non_finite};
  job.abandoned = true;
  if (job.writer.joinable()) job.writer.join();
  world_.barrier();  // no rank writes into the directory any more
  if (committer()) {
    std::error_code ec;
    fs::remove_all(job.tmp_dir, ec);
  }
  chain_.clear();
  previous_.clear();
  keep_buffers(job, false);
  job_.reset();
  if (s_.on_non_finite) s_.on_non_finite(found);
  MOE_RUN_FAILED("after step " << found.step << ", " << found.count
                               << " values of the checkpoint's state are not finite; it is not committed");
}

void Checkpointer::poll() {
  if (job_) commit(*job_, false);
}

void Checkpointer::finish() {
  if (job_) commit(*job_, true);
}

double Checkpointer::wait_snapshot() {
  if (!job_ || job_->checked) return 0;
  const auto t0 = Clock::now();
  check_snapshot(*job_);
  const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  job_->stall_s += waited;
  return waited;
}

// After the writer: a piece's values stay as the next delta's reference, the other buffer is kept for reuse.
void Checkpointer::keep_buffers(Job& job, bool written) {
  for (Job::Snap& s : job.snaps) {
    if (written) {
      previous_[s.key] = std::move(s.raw);
      if (s.prev.capacity() > 0) spare_[s.key] = std::move(s.prev);
    } else {
      spare_[s.key] = std::move(s.raw.capacity() >= s.prev.capacity() ? s.raw : s.prev);
    }
  }
}

void Checkpointer::commit(Job& job, bool wait) {
  check_snapshot(job);  // a snapshot that is not finite goes no further
  // Every rank learns whether every rank has written (and whether any failed).
  if (wait && job.writer.joinable()) job.writer.join();
  int64_t flags[2] = {job.state == 0 ? 1 : 0, job.state == 2 ? 1 : 0};
  world_.allreduce_sum(flags, 2);
  if (flags[0] > 0) return;  // someone is still writing: try again at the next step
  if (job.writer.joinable()) job.writer.join();
  if (flags[1] > 0) {
    if (committer()) {
      std::error_code ec;
      fs::remove_all(job.tmp_dir, ec);
    }
    const std::string msg = "checkpoint at step " + std::to_string(job.step) + " failed on " +
                            std::to_string(flags[1]) + " rank(s)" + (job.error.empty() ? "" : ": " + job.error) +
                            "; the previous checkpoint stays the newest";
    if (log_) log_(msg);
    failed_step_ = job.step;
    failure_ = msg;
    chain_.clear();  // the next save starts a new full chain
    previous_.clear();
    keep_buffers(job, false);
    job_.reset();
    return;
  }
  json mine = json::array({to_json(job.entry)});
  if (s_.peer_copy && world_.size() > 1) mine.push_back(to_json(copy_to_peer(job)));
  const std::vector<std::string> entries = allgather_strings(world_, mine.dump());
  // Every committer writes the same manifest, byte for byte: the creation time is rank 0's.
  const std::string created = allgather_strings(world_, world_.rank() == 0 ? utc_now() : std::string())[0];
  if (committer()) {
    Manifest m;
    m.step = job.step;
    m.kind = job.kind;
    m.chain = job.chain;
    m.created = created;
    m.config = run_info_.value("config", json::object());
    m.layout = run_info_.value("layout", json::object());
    m.versions = run_info_.value("versions", json::object());
    m.data = run_info_.value("data", json());
    m.run_id = run_info_.value("run_id", std::string());
    int64_t bytes = 0;
    for (const std::string& e : entries)
      for (const json& f : json::parse(e)) {
        m.files.push_back(file_entry_from_json(f, "a rank's file entry"));
        bytes += m.files.back().size;
      }
    for (size_t i = 0; i + 1 < job.chain.size(); ++i)
      m.chain_manifests.push_back(file_xxh64((fs::path(s_.root) / job.chain[i] / kManifestName).string()));
    std::error_code ec;
    try {
      write_manifest(job.tmp_dir.string(), m);
    } catch (const Error&) {
      fs::remove_all(job.tmp_dir, ec);  // nothing half-written is left; the previous checkpoint stays the newest
      throw;
    }
    // Checkpoints after this step belong to a timeline this run abandoned (it resumed from an earlier
    // one): they are removed so that nothing newer than the run's own state is ever resumed.
    remove_later_than(s_.root, job.step);
    fs::remove_all(job.final_dir, ec);  // a stale directory of the same step (from a run that crashed)
    fs::rename(job.tmp_dir, job.final_dir);
    fsync_directory(s_.root);
    write_latest(s_.root, job.final_dir.filename().string());
    apply_retention(s_.root);
    for (const std::string& replica : s_.replicas) {
      if (s_.replica_delay_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(s_.replica_delay_s));
      try {
        const fs::path tmp = fs::path(replica) / ("tmp-" + job.final_dir.filename().string());
        fs::remove_all(tmp, ec);
        fs::create_directories(replica);
        copy_directory(job.final_dir, tmp);
        for (const FileEntry& f : m.files) {  // read back: the copy must be what the manifest says
          int64_t size = 0;
          const std::string h = file_xxh64((tmp / f.name).string(), &size);
          if (h != f.xxh64 || size != f.size)
            MOE_FAIL("the copy of " << f.name << " does not match its manifest entry");
          fsync_file((tmp / f.name).string());
        }
        fsync_file((tmp / kManifestName).string());
        remove_later_than(replica, job.step);
        fs::remove_all(fs::path(replica) / job.final_dir.filename(), ec);
        fs::rename(tmp, fs::path(replica) / job.final_dir.filename());
        fsync_directory(replica);
        write_latest(replica, job.final_dir.filename().string());
        apply_retention(replica);
      } catch (const std::exception& e) {
        if (log_)
          log_("copying checkpoint step " + std::to_string(job.step) + " to replica " + replica +
               " failed: " + e.what());
      }
    }
    report_ = {job.step, job.kind, job.stall_s, job.write_s, bytes};
  }
  if (world_.rank() != 0) {
    report_ = {job.step, job.kind, job.stall_s, job.write_s, 0};
  }
  world_.barrier();  // every rank returns once the committers are done (in_flight)
  keep_buffers(job, true);
  job_.reset();
}

// Collective: every rank sends its file to its peer and keeps the file of the rank whose peer it is.
FileEntry Checkpointer::copy_to_peer(const Job& job) {
  const int64_t W = world_.size(), r = world_.rank();
  const int64_t stride = W > s_.local_ranks ? s_.local_ranks : 1;
  const int dest = int((r + stride) % W), source = int((r - stride % W + W) % W);
  std::vector<char> bytes;
  {
    std::ifstream in(job.tmp_dir / job.entry.name, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  int64_t size = int64_t(bytes.size()), their_size = 0;
  constexpr int kTag = 7301;
  world_.sendrecv_bytes(&size, 8, dest, &their_size, 8, source, kTag);
  std::vector<char> theirs(static_cast<size_t>(their_size));
  world_.sendrecv_bytes(bytes.data(), size, dest, theirs.data(), their_size, source, kTag);
  FileEntry e;
  e.name = peer_file_name(source);
  e.rank = source;
  e.peer_copy = true;
  const fs::path path = job.tmp_dir / e.name;
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(theirs.data(), their_size);
    if (!out) MOE_FAIL("cannot write the peer copy " << path.string());
  }
  {
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd >= 0) ::fsync(fd), ::close(fd);
  }
  e.xxh64 = file_xxh64(path.string(), &e.size);
  return e;
}

bool Checkpointer::committer() const {
  return s_.node_local ? world_.rank() % std::max<int64_t>(1, s_.local_ranks) == 0 : world_.rank() == 0;
}

void Checkpointer::apply_retention(const std::string& root) {
  // Chains by their base directory; the newest `keep` chains (by their newest step) stay.
  std::map<std::string, int64_t> newest_of_chain;
  for (const std::string& dir : list_checkpoints(root)) {
    try {
      const Manifest m = read_manifest(dir);
      int64_t& newest = newest_of_chain[m.chain.front()];
      newest = std::max(newest, m.step);
    } catch (const Error&) {
      // An unreadable checkpoint is left alone: deleting what we cannot read is not ours to decide.
    }
  }
  std::vector<std::pair<int64_t, std::string>> chains;
  for (const auto& [base, newest] : newest_of_chain) chains.emplace_back(newest, base);
  std::sort(chains.rbegin(), chains.rend());
  for (size_t i = size_t(std::max<int64_t>(s_.keep, 1)); i < chains.size(); ++i) {
    const std::string base = chains[i].second;
    for (const std::string& dir : list_checkpoints(root)) {
      try {
        if (read_manifest(dir).chain.front() == base) fs::remove_all(dir);
      } catch (const Error&) {
      }
    }
  }
}

}  // namespace moe::ckpt
