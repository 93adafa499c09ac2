// bench_comm: bandwidth of the collectives the trainer uses, through MpiCommunicator (host memory), in the
// style of nccl-tests: all-reduce (float sum, in place), all-to-allv (uniform and skewed split sizes; and
// the nonblocking ialltoallv, started then waited) and point to point (isend/irecv around a ring)
// for message sizes doubling from --min-bytes to --max-bytes, against a memcpy of the same size run on
// every rank at once in the same process (on one machine MPI moves the data through shared memory).
// Run it under mpirun; rank 0 prints human-readable tables, then one line of JSON with every figure.
// It measures and checks that each collective delivered the right values; it asserts nothing about
// speed (the ctest entry runs --quick on 2 ranks and checks the exit code). Not here: NCCL, device memory,
// latency models, overlap with compute.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/mpi_bench_main.h"
#include "bench/timing.h"
#include "core/error.h"
#include "parallel/mpi_communicator.h"

namespace moe::bench {
namespace {

struct Options {
  int64_t min_bytes = 1024;
  int64_t max_bytes = int64_t(64) << 20;
  int reps = 20;
  int warmup = 3;
  bool quick = false;
};

// Back-to-back calls per timed repetition: enough that a small message's time is not the barrier's skew
// between ranks, one call once a message is large. The per-call time is the repetition's time / calls.
int calls_per_rep(int64_t bytes) {
  const int64_t target_bytes = int64_t(8) << 20;
  return int(std::clamp<int64_t>(target_bytes / std::max<int64_t>(bytes, 1), 1, 64));
}

// Timing protocol, the same for every operation including the memcpy baseline: a barrier, then
// `calls` calls timed on each rank; a repetition's time is the slowest rank's (a collective is done when
// its last rank is), divided by `calls`. Returns the median, min and max over `reps` repetitions after
// `warmup` untimed ones.
template <class Call>
Summary time_on_every_rank(MpiCommunicator& comm, int warmup, int reps, int calls, Call&& call) {
  for (int i = 0; i < warmup; ++i) {
    comm.barrier();
    for (int c = 0; c < calls; ++c) call();
  }
  std::vector<double> seconds;
  for (int i = 0; i < reps; ++i) {
    comm.barrier();
    const Stopwatch clock;
    for (int c = 0; c < calls; ++c) call();
    seconds.push_back(clock.seconds() / calls);
  }
  CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, seconds.data(), reps, MPI_DOUBLE, MPI_MAX, comm.handle()),
            "allreduce(max) of the timings on the world communicator");
  return summarize(seconds);
}

int64_t max_over_ranks(MpiCommunicator& comm, int64_t value) {
  CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_INT64_T, MPI_MAX, comm.handle()),
            "allreduce(max) of a byte count on the world communicator");
  return value;
}

// One row of a table: a message size and what it achieved.
struct Row {
  int64_t bytes = 0;  // per rank: the all-reduce buffer, or everything one rank sends in the all-to-all
  int calls = 0;
  Summary time_s;
  double algbw = 0;        // bytes / median time, GB/s (1e9 bytes)
  double busbw = 0;        // algbw x the operation's nccl-tests factor
  double max_recv_bw = 0;  // all-to-all only: bytes the busiest rank receives from other ranks / median time
  double memcpy_bw = 0;    // the baseline row of the same size
};

struct Table {
  std::string name;
  std::string busbw_factor;  // as printed and written to JSON
  std::vector<Row> rows;
};

// ---- the baseline

// memcpy of `bytes` on every rank at the same time, alternating direction so that no call repeats the
// previous one; bandwidth counts the bytes once (as algbw does), not read + write.
Row measure_memcpy(MpiCommunicator& comm, int64_t bytes, float* a, float* b, int warmup, int reps) {
  Row row;
  row.bytes = bytes;
  row.calls = calls_per_rep(bytes);
  bool forward = true;
  row.time_s = time_on_every_rank(comm, warmup, reps, row.calls, [&] {
    std::memcpy(forward ? b : a, forward ? a : b, size_t(bytes));
    forward = !forward;
  });
  row.algbw = row.busbw = double(bytes) / row.time_s.median * 1e-9;
  row.memcpy_bw = row.algbw;
  return row;
}

// ---- all-reduce

// Inputs encode their source (rank * 1000 + index % 1000), so the sum is an exact integer in float for up
// to a few hundred ranks and is compared with ==; the count of wrong elements is summed over ranks.
void check_allreduce(MpiCommunicator& comm, float* data, int64_t count) {
  const int n = comm.size();
  for (int64_t i = 0; i < count; ++i) data[i] = float(comm.rank() * 1000 + i % 1000);
  comm.allreduce_sum(data, count);
  int64_t wrong = 0;
  for (int64_t i = 0; i < count; ++i) wrong += data[i] != float(1000 * (n * (n - 1) / 2) + n * (i % 1000));
  comm.allreduce_sum(&wrong, 1);
  MOE_CHECK(wrong == 0, "allreduce_sum of " << count << " floats on " << n << " ranks: " << wrong
                                            << " elements differ from the exact sum");
}

// busbw = algbw x 2(n-1)/n (nccl-tests): a ring all-reduce moves 2(n-1)/n of the buffer through each rank.
Row measure_allreduce(MpiCommunicator& comm, int64_t bytes, float* data, int warmup, int reps) {
  const int64_t count = bytes / int64_t(sizeof(float));
  check_allreduce(comm, data, count);
  // Timed on zeros: the sum costs the same for any finite value, and repeated in-place sums of zeros
  // neither overflow nor turn denormal.
  std::fill(data, data + count, 0.0f);
  Row row;
  row.bytes = count * int64_t(sizeof(float));
  row.calls = calls_per_rep(bytes);
  row.time_s = time_on_every_rank(comm, warmup, reps, row.calls, [&] { comm.allreduce_sum(data, count); });
  const int n = comm.size();
  row.algbw = double(row.bytes) / row.time_s.median * 1e-9;
  row.busbw = row.algbw * 2.0 * (n - 1) / n;
  return row;
}

// ---- all-to-allv

enum class Split { Uniform, Skewed };
enum class Form { Blocking, Nonblocking };  // alltoallv, or ialltoallv then wait

void alltoallv(MpiCommunicator& comm, Form form, const float* send, const std::vector<int64_t>& send_counts,
               float* recv, const std::vector<int64_t>& recv_counts) {
  if (form == Form::Blocking)
    comm.alltoallv(send, send_counts.data(), recv, recv_counts.data());
  else
    comm.ialltoallv(send, send_counts.data(), recv, recv_counts.data())->wait();
}

// The share of its data every rank sends to destination d. Uniform: 1/n. Skewed: Zipf with exponent 1
// over the destination's rank, the same for every source: w_d = (1 / (d + 1)) / H_n, H_n = sum_{k=1..n} 1/k
// (2 ranks: 2/3, 1/3; 4 ranks: 0.48, 0.24, 0.16, 0.12), so rank 0 receives n w_0 times what it sends
// (a hot expert on rank 0).
std::vector<double> destination_shares(Split split, int n) {
  std::vector<double> w(size_t(n), 1.0 / n);
  if (split == Split::Skewed) {
    double harmonic = 0;
    for (int k = 1; k <= n; ++k) harmonic += 1.0 / k;
    for (int d = 0; d < n; ++d) w[size_t(d)] = 1.0 / (d + 1) / harmonic;
  }
  return w;
}

// Elements this rank sends to each destination, `count` in all: floor(count x w_d), the remainder to
// rank 0. Uniform with count not a multiple of n sends count - count % n (so uniform stays uniform).
std::vector<int64_t> send_counts_for(Split split, int n, int64_t count) {
  const std::vector<double> w = destination_shares(split, n);
  std::vector<int64_t> counts(static_cast<size_t>(n));
  if (split == Split::Uniform) {
    std::fill(counts.begin(), counts.end(), count / n);
    return counts;
  }
  int64_t assigned = 0;
  for (int d = 0; d < n; ++d) assigned += counts[size_t(d)] = int64_t(std::floor(double(count) * w[size_t(d)]));
  counts[0] += count - assigned;
  return counts;
}

float alltoallv_value(int src, int64_t k) { return float(src * 1000 + k % 1000); }

// Element k of what rank src sends to any destination is src * 1000 + k % 1000: exact in float, it names
// its source, and the receiver compares with ==; the count of wrong elements is summed over ranks.
void check_alltoallv(MpiCommunicator& comm, Form form, float* send, const std::vector<int64_t>& send_counts,
                     float* recv, const std::vector<int64_t>& recv_counts) {
  const int n = comm.size();
  int64_t at = 0;
  for (int d = 0; d < n; ++d)
    for (int64_t k = 0; k < send_counts[size_t(d)]; ++k) send[at++] = alltoallv_value(comm.rank(), k);
  alltoallv(comm, form, send, send_counts, recv, recv_counts);
  int64_t wrong = 0;
  at = 0;
  for (int s = 0; s < n; ++s)
    for (int64_t k = 0; k < recv_counts[size_t(s)]; ++k) wrong += recv[at++] != alltoallv_value(s, k);
  comm.allreduce_sum(&wrong, 1);
  MOE_CHECK(wrong == 0, "alltoallv on " << n << " ranks: " << wrong << " received elements differ from what was sent");
}

// busbw = algbw x (n-1)/n (nccl-tests' all-to-all factor, which assumes uniform splits): the share of a
// rank's data that leaves it. For skewed splits the busiest receiver is the better measure: max_recv_bw.
Row measure_alltoallv(MpiCommunicator& comm, Split split, Form form, int64_t bytes, float* send, float* recv,
                      int warmup, int reps) {
  const int n = comm.size(), me = comm.rank();
  const std::vector<int64_t> send_counts = send_counts_for(split, n, bytes / int64_t(sizeof(float)));
  std::vector<int64_t> recv_counts(static_cast<size_t>(n));
  comm.alltoall(send_counts.data(), recv_counts.data(), 1);  // as the MoE dispatcher learns its receive counts
  check_alltoallv(comm, form, send, send_counts, recv, recv_counts);
  Row row;
  for (const int64_t c : send_counts) row.bytes += c * int64_t(sizeof(float));
  row.calls = calls_per_rep(bytes);
  row.time_s = time_on_every_rank(comm, warmup, reps, row.calls,
                                  [&] { alltoallv(comm, form, send, send_counts, recv, recv_counts); });
  int64_t received_from_others = 0;
  for (int s = 0; s < n; ++s)
    if (s != me) received_from_others += recv_counts[size_t(s)] * int64_t(sizeof(float));
  const int64_t max_received = max_over_ranks(comm, received_from_others);
  row.algbw = double(row.bytes) / row.time_s.median * 1e-9;
  row.busbw = row.algbw * double(n - 1) / n;
  row.max_recv_bw = double(max_received) / row.time_s.median * 1e-9;
  return row;
}

// ---- point to point

// One step of a ring: isend `count` floats to the next rank and irecv as many from the previous one,
// both posted before either is waited on (the exchange of neighbouring pipeline stages).
void ring_step(MpiCommunicator& comm, const float* send, float* recv, int64_t count) {
  const int n = comm.size(), me = comm.rank();
  auto received = comm.irecv(recv, count, (me + n - 1) % n, 31);
  auto sent = comm.isend(send, count, (me + 1) % n, 31);
  received->wait();
  sent->wait();
}

// busbw = algbw (nccl-tests' sendrecv): every byte a rank sends crosses one link once.
Row measure_ring(MpiCommunicator& comm, int64_t bytes, float* send, float* recv, int warmup, int reps) {
  const int n = comm.size(), me = comm.rank();
  const int64_t count = bytes / int64_t(sizeof(float));
  for (int64_t k = 0; k < count; ++k) send[k] = alltoallv_value(me, k);
  ring_step(comm, send, recv, count);
  int64_t wrong = 0;
  for (int64_t k = 0; k < count; ++k) wrong += recv[k] != alltoallv_value((me + n - 1) % n, k);
  comm.allreduce_sum(&wrong, 1);
  MOE_CHECK(wrong == 0, "isend/irecv ring on " << n << " ranks: " << wrong << " received elements differ");
  Row row;
  row.bytes = count * int64_t(sizeof(float));
  row.calls = calls_per_rep(bytes);
  row.time_s = time_on_every_rank(comm, warmup, reps, row.calls, [&] { ring_step(comm, send, recv, count); });
  row.algbw = row.busbw = double(row.bytes) / row.time_s.median * 1e-9;
  return row;
}

// Receive elements the skewed split needs at most on any rank for `count` sent per rank (n x the largest
// share), so the buffers are allocated and touched once, before anything is timed.
int64_t max_recv_count(int n, int64_t count) {
  const std::vector<int64_t> counts = send_counts_for(Split::Skewed, n, count);
  return std::max<int64_t>(count, n * *std::max_element(counts.begin(), counts.end()));
}

// ---- output

std::string human_bytes(int64_t bytes) {
  char text[32];
  if (bytes >= (int64_t(1) << 20) && bytes % (int64_t(1) << 20) == 0)
    std::snprintf(text, sizeof text, "%lld MiB", (long long)(bytes >> 20));
  else if (bytes >= 1024 && bytes % 1024 == 0)
    std::snprintf(text, sizeof text, "%lld KiB", (long long)(bytes >> 10));
  else
    std::snprintf(text, sizeof text, "%lld B", (long long)bytes);
  return text;
}

void print_header(bool with_recv) {
  std::printf("  %9s %12s %6s %11s %11s %11s %12s%s %9s\n", "size", "count(fp32)", "calls", "time(us)", "min(us)",
              "algbw(GB/s)", "busbw(GB/s)", with_recv ? " maxrecv(GB/s)" : "", "x memcpy");
}

void print_row(const Row& r, bool with_recv) {
  char recv[32] = "";
  if (with_recv) std::snprintf(recv, sizeof recv, " %13.2f", r.max_recv_bw);
  std::printf("  %9s %12lld %6d %11.1f %11.1f %11.2f %12.2f%s %9.3f\n", human_bytes(r.bytes).c_str(),
              (long long)(r.bytes / int64_t(sizeof(float))), r.calls, r.time_s.median * 1e6, r.time_s.min * 1e6,
              r.algbw, r.busbw, recv, r.busbw / r.memcpy_bw);
  std::fflush(stdout);
}

nlohmann::json row_json(const Row& r, bool with_recv) {
  nlohmann::json j = {{"bytes", r.bytes},
                      {"count", r.bytes / int64_t(sizeof(float))},
                      {"calls_per_rep", r.calls},
                      {"time_us", summary_json(r.time_s, 1e6)},
                      {"algbw_gbps", r.algbw},
                      {"busbw_gbps", r.busbw},
                      {"ratio_to_memcpy", r.busbw / r.memcpy_bw}};
  if (with_recv) j["max_recv_gbps"] = r.max_recv_bw;
  return j;
}

std::string mpi_library() {
  char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  MPI_Get_library_version(version, &length);
  std::string text(version, size_t(length));
  const size_t end = text.find_first_of(",\n");
  return end == std::string::npos ? text : text.substr(0, end);
}

std::vector<int64_t> message_sizes(const Options& o) {
  std::vector<int64_t> sizes;
  for (int64_t b = o.min_bytes; b <= o.max_bytes; b *= 2) sizes.push_back(b);
  return sizes;
}

// The all-to-all-v tables (uniform, skewed, and uniform through ialltoallv), printed by the leader as they fill.
std::vector<Table> measure_alltoallv_tables(MpiCommunicator& comm, const Options& o, const std::vector<int64_t>& sizes,
                                            const Table& memcpy_table, float* a, float* b) {
  const int n = comm.size();
  const bool leader = comm.rank() == 0;
  const std::vector<double> skew = destination_shares(Split::Skewed, n);
  std::string skew_text;
  for (const double w : skew) {
    char share[16];
    std::snprintf(share, sizeof share, "%.3f", w);
    skew_text += (skew_text.empty() ? "" : ", ") + std::string(share);
  }
  struct AlltoallvCase {
    Split split;
    Form form;
  };
  const AlltoallvCase cases[] = {
      {Split::Uniform, Form::Blocking}, {Split::Skewed, Form::Blocking}, {Split::Uniform, Form::Nonblocking}};
  std::vector<Table> alltoallv{
      {"alltoallv_uniform", "(n-1)/n", {}}, {"alltoallv_skewed", "(n-1)/n", {}}, {"ialltoallv_uniform", "(n-1)/n", {}}};
  for (size_t c = 0; c < alltoallv.size(); ++c) {
    const AlltoallvCase& what = cases[c];
    Table& table = alltoallv[c];
    if (leader) {
      if (what.form == Form::Nonblocking)
        std::printf(
            "ialltoallv, uniform: as alltoallv, uniform, through the nonblocking form (ialltoallv, then wait on\n"
            "  its request at once: the cost of the path the MoE dispatcher's start/finish takes):\n");
      else if (what.split == Split::Uniform)
        std::printf(
            "alltoallv, uniform: every rank sends bytes/n to each rank (itself included); bytes = what one\n"
            "  rank sends; maxrecv = bytes the busiest rank receives from other ranks / time:\n");
      else
        std::printf(
            "alltoallv, skewed: every rank sends share w_d = (1/(d+1)) / H_n of its bytes to rank d (Zipf,\n"
            "  exponent 1, over the destination's rank): w = [%s]; rank 0 receives %.2f x the bytes it sends:\n",
            skew_text.c_str(), n * skew[0]);
      print_header(true);
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
      Row row = measure_alltoallv(comm, what.split, what.form, sizes[i], a, b, o.warmup, o.reps);
      row.memcpy_bw = memcpy_table.rows[i].algbw;
      if (leader) print_row(row, true);
      table.rows.push_back(row);
    }
  }

  return alltoallv;
}

Table measure_ring_table(MpiCommunicator& comm, const Options& o, const std::vector<int64_t>& sizes,
                         const Table& memcpy_table, float* a, float* b) {
  const bool leader = comm.rank() == 0;
  Table ring{"sendrecv_ring", "1", {}};
  if (leader) {
    std::printf(
        "isend/irecv ring: every rank sends bytes to the next rank and receives as many from the previous one\n"
        "  (both posted, then both waited; MpiCommunicator::isend/irecv); busbw = algbw:\n");
    print_header(false);
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    Row row = measure_ring(comm, sizes[i], a, b, o.warmup, o.reps);
    row.memcpy_bw = memcpy_table.rows[i].algbw;
    if (leader) print_row(row, false);
    ring.rows.push_back(row);
  }

  return ring;
}

// One line of JSON with every figure (rank 0).
void print_json(const Options& o, int n, const std::string& load_start, const std::string& load_end,
                const Table& memcpy_table, const std::vector<const Table*>& tables) {
  const std::vector<double> skew = destination_shares(Split::Skewed, n);
  nlohmann::json out = {
      {"bench", "comm"},
      {"ranks", n},
      {"mpi_library", mpi_library()},
      {"quick", o.quick},
      {"reps", o.reps},
      {"warmup", o.warmup},
      {"time_convention", "per call; slowest rank of a repetition; median over repetitions"},
      {"bandwidth_convention", "GB/s = 1e9 bytes/s; algbw = bytes / time; busbw = algbw x factor (nccl-tests)"},
      {"skewed_shares", skew},
      {"load_average_start", load_start},
      {"load_average_end", load_end}};
  nlohmann::json memcpy_rows = nlohmann::json::array();
  for (const Row& r : memcpy_table.rows)
    memcpy_rows.push_back(
        {{"bytes", r.bytes}, {"calls_per_rep", r.calls}, {"time_us", summary_json(r.time_s, 1e6)}, {"gbps", r.algbw}});
  out["memcpy"] = memcpy_rows;
  for (const Table* t : tables) {
    const bool with_recv = t->name.find("alltoallv") != std::string::npos;
    nlohmann::json rows = nlohmann::json::array();
    for (const Row& r : t->rows) rows.push_back(row_json(r, with_recv));
    out[t->name] = {{"busbw_factor", t->busbw_factor}, {"sizes", rows}};
  }
  std::printf("%s\n", out.dump().c_str());
}

void run(Options o, MpiCommunicator& comm) {
  if (o.quick) {  // a smoke check of every code path, not a measurement
    o.min_bytes = 1024;
    o.max_bytes = std::min<int64_t>(o.max_bytes, 64 * 1024);
    o.reps = std::min(o.reps, 3);
    o.warmup = 1;
  }
  if (o.min_bytes % int64_t(sizeof(float)) != 0 || o.min_bytes > o.max_bytes)
    MOE_BAD_INPUT("--min-bytes " << o.min_bytes << " and --max-bytes " << o.max_bytes
                                 << ": expected a multiple of 4 bytes (one float) and min <= max");
  const int n = comm.size();
  const bool leader = comm.rank() == 0;
  const std::vector<int64_t> sizes = message_sizes(o);
  const int64_t max_count = sizes.back() / int64_t(sizeof(float));
  // One pair of buffers for everything, touched once here so that no timed call pays for page faults.
  std::vector<float> a(size_t(max_count), 1.0f), b(size_t(max_recv_count(n, max_count)), 1.0f);

  const std::string load_start = load_average();
  if (leader) {
    std::printf("bench_comm: %d ranks, %s, host memory; load average %s at start%s\n", n, mpi_library().c_str(),
                load_start.c_str(), o.quick ? "; --quick: sizes too small to mean anything" : "");
    std::printf(
        "each size: %d warm-up repetitions, median of %d; a repetition = barrier, then `calls` back-to-back calls;\n"
        "  its time per call is the slowest rank's / calls. GB/s = 1e9 bytes/s. algbw = bytes / time;\n"
        "  busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for all-to-all (nccl-tests' definitions);\n"
        "  x memcpy = busbw / the memcpy bandwidth of the same size measured on every rank at once\n",
        o.warmup, o.reps);
    std::fflush(stdout);
  }

  Table memcpy_table{"memcpy", "1", {}};
  for (const int64_t bytes : sizes)
    memcpy_table.rows.push_back(measure_memcpy(comm, bytes, a.data(), b.data(), o.warmup, o.reps));
  if (leader) {
    std::printf("memcpy baseline (std::memcpy on every rank at once, bytes counted once):\n");
    std::printf("  %9s %6s %11s %11s %11s\n", "size", "calls", "time(us)", "min(us)", "GB/s");
    for (const Row& r : memcpy_table.rows)
      std::printf("  %9s %6d %11.2f %11.2f %11.2f\n", human_bytes(r.bytes).c_str(), r.calls, r.time_s.median * 1e6,
                  r.time_s.min * 1e6, r.algbw);
    std::fflush(stdout);
  }
  auto memcpy_bw = [&](size_t i) { return memcpy_table.rows[i].algbw; };

  Table allreduce{"allreduce", "2(n-1)/n", {}};
  if (leader) {
    std::printf(
        "allreduce: float sum in place (MpiCommunicator::allreduce_sum = MPI_Allreduce), bytes = the buffer:\n");
    print_header(false);
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    Row row = measure_allreduce(comm, sizes[i], a.data(), o.warmup, o.reps);
    row.memcpy_bw = memcpy_bw(i);
    if (leader) print_row(row, false);
    allreduce.rows.push_back(row);
  }

  const std::vector<Table> alltoallv = measure_alltoallv_tables(comm, o, sizes, memcpy_table, a.data(), b.data());
  const Table ring = measure_ring_table(comm, o, sizes, memcpy_table, a.data(), b.data());

  const std::string load_end = load_average();
  if (!leader) return;
  std::printf("load average %s at end\n", load_end.c_str());
  print_json(o, n, load_start, load_end, memcpy_table,
             {&allreduce, &alltoallv[0], &alltoallv[1], &alltoallv[2], &ring});
}

}  // namespace
}  // namespace moe::bench

int main(int argc, char** argv) {
  moe::bench::Options options;
  CLI::App app{
      "bench_comm: nccl-tests-style bandwidth of all-reduce, all-to-allv (blocking and nonblocking) and isend/irecv "
      "through MpiCommunicator, as a ratio "
      "to a memcpy of the same size measured in the same run. Run it under mpirun. See docs/bench.md.",
      "bench_comm"};
  app.add_option("--min-bytes", options.min_bytes, "Smallest message, bytes per rank (a multiple of 4)")
      ->check(CLI::Range(int64_t(4), int64_t(1) << 32));
  app.add_option("--max-bytes", options.max_bytes, "Largest message, bytes per rank; sizes double from the smallest")
      ->check(CLI::Range(int64_t(4), int64_t(1) << 32));
  app.add_option("--reps", options.reps, "Timed repetitions per size (the median is reported)")
      ->check(CLI::Range(1, 100000));
  app.add_option("--warmup", options.warmup, "Untimed repetitions per size before measuring")
      ->check(CLI::Range(0, 100000));
  app.add_flag("--quick", options.quick, "1 KiB to 64 KiB, 3 repetitions: a smoke check, not a measurement");
  return moe::bench::parse_and_run_mpi(app, argc, argv, "bench_comm",
                                       [&](moe::MpiCommunicator& world) { moe::bench::run(options, world); });
}
