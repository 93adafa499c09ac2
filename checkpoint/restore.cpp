// Restoring checkpoints: verification with fallbacks (replicas, peer copies, older checkpoints), reading
// the ranges a rank needs along a delta chain, and the collective restore from node-local roots.
#include <xxhash.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "checkpoint/checkpointer.h"
#include "checkpoint/detail.h"
#include "checkpoint/stacked.h"
#include "core/error.h"
#include "parallel/strings.h"

namespace moe::ckpt {
namespace fs = std::filesystem;
using json = nlohmann::json;
using detail::dtype_size;
using detail::step_of_dir;

// ---- Restore ------------------------------------------------------------------------------------

std::vector<std::string> list_checkpoints(const std::string& root) {
  std::vector<std::pair<std::string, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return {};
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && name.rfind("step-", 0) == 0) found.emplace_back(name, entry.path().string());
  }
  std::sort(found.rbegin(), found.rend());
  std::vector<std::string> dirs;
  for (auto& f : found) dirs.push_back(f.second);
  return dirs;
}

namespace {
// Why a resume of run `run_id` passes over checkpoint m ("" when it does not).
std::string other_run(const Manifest& m, const std::optional<std::string>& run_id) {
  if (!run_id || m.run_id.empty() || m.run_id == *run_id) return "";
  return "written by another run (run id " + m.run_id + "); name it with --resume PATH to start from it";
}
}  // namespace

std::optional<Resolved> find_newest(const std::string& root, const std::vector<std::string>& replicas,
                                    std::vector<std::string>* notes, const std::vector<TensorExpectation>* expected,
                                    const std::optional<std::string>& run_id) {
  for (const std::string& dir : list_checkpoints(root)) {
    std::string why;
    try {
      why = other_run(read_manifest(dir), run_id);
    } catch (const Error&) {
      // verify_checkpoint says what is wrong with it
    }
    if (!why.empty()) {
      notes->push_back("skipped " + dir + ": " + why);
      continue;
    }
    std::optional<Resolved> r = verify_checkpoint(dir, replicas, &why, expected);
    if (r) {
      notes->insert(notes->end(), r->notes.begin(), r->notes.end());
      return r;
    }
    notes->push_back("skipped " + dir + ": " + why);
  }
  return std::nullopt;
}

namespace {

// What piece p needs of dataset d: the runs they share, within the span [lo, hi) of d's stored elements.
struct Need {
  std::vector<Run> runs;
  int64_t lo = 0, hi = 0, elements = 0;
};

Need need_of(const Piece& p, const DatasetEntry& d, const std::string& checkpoint) {
  if (d.global_shape() != p.slab.global_shape)
    MOE_BAD_INPUT("checkpoint " << checkpoint << ": tensor " << p.tensor << " has global shape "
                                << json(d.global_shape()).dump() << ", this run expects "
                                << json(p.slab.global_shape).dump());
  Need n;
  n.runs = intersect(p.slab, d.slab);
  if (n.runs.empty()) return n;
  n.lo = n.runs.front().from, n.hi = n.lo;
  for (const Run& r : n.runs) {
    n.lo = std::min(n.lo, r.from), n.hi = std::max(n.hi, r.from + r.length);
    n.elements += r.length;
  }
  return n;
}

// The stored elements [lo, hi) of d, as bytes (32-bit words for an XOR delta).
std::vector<uint8_t> read_span(ShardReader& reader, const DatasetEntry& d, int64_t lo, int64_t hi) {
  const int64_t esize = int64_t(dtype_size(d.dtype));
  std::vector<uint8_t> buf(size_t((hi - lo) * esize));
  if (d.xor_delta)
    reader.read(d.dataset, DType::U32, lo * esize / 4, (hi - lo) * esize / 4, buf.data());
  else
    reader.read(d.dataset, d.dtype, lo, hi - lo, buf.data());
  return buf;
}

// Puts the elements of `span` (d's stored elements from n.lo) where p needs them: values, or XORed in.
void place(const Piece& p, const Need& n, const uint8_t* span, bool xor_delta) {
  const int64_t esize = int64_t(dtype_size(p.dtype));
  auto* out = static_cast<uint8_t*>(p.dst);
  for (const Run& r : n.runs) {
    uint8_t* dst = out + r.to * esize;
    const uint8_t* src = span + (r.from - n.lo) * esize;
    if (xor_delta)
      for (int64_t i = 0; i < r.length * esize; ++i) dst[i] ^= src[i];
    else
      std::memcpy(dst, src, size_t(r.length * esize));
  }
}

}  // namespace

void load_pieces(const Resolved& ck, const std::vector<Piece>& pieces) {
  std::map<std::string, std::unique_ptr<ShardReader>> readers;
  auto reader = [&](const std::string& path) -> ShardReader& {
    auto& r = readers[path];
    if (!r) r = std::make_unique<ShardReader>(path);
    return *r;
  };
  for (const Piece& p : pieces) {
    for (size_t c = 0; c < ck.chain.size(); ++c) {
      const Manifest& m = ck.chain[c];
      int64_t covered = 0;
      for (size_t fi = 0; fi < m.files.size(); ++fi) {
        if (ck.paths[c][fi].empty()) continue;
        for (const DatasetEntry& d : m.files[fi].datasets) {
          if (d.tensor != p.tensor) continue;
          const Need n = need_of(p, d, ck.chain_dirs[c]);
          if (n.runs.empty()) continue;
          const std::vector<uint8_t> span = read_span(reader(ck.paths[c][fi]), d, n.lo, n.hi);
          place(p, n, span.data(), d.xor_delta);
          covered += n.elements;
        }
      }
      if (covered != p.count())
        MOE_BAD_INPUT("checkpoint " << ck.chain_dirs[c] << " holds " << covered << " of the " << p.count()
                                    << " elements of " << p.tensor << " this rank needs (" << p.slab.text()
                                    << "); it does not fit this run");
    }
  }
}

// ---- Restore from node-local roots ----------------------------------------------------------------

namespace {

// Sends words[q] to rank q; returns what every rank sent to this one. Words travel as float bit patterns
// (MPI copies them unchanged between hosts of one kind).
std::vector<std::vector<uint32_t>> exchange_words(Communicator& world,
                                                  const std::vector<std::vector<uint32_t>>& words) {
  const int P = world.size();
  std::vector<int64_t> send_counts(static_cast<size_t>(P)), recv_counts(static_cast<size_t>(P));
  for (int q = 0; q < P; ++q) send_counts[q] = int64_t(words[q].size());
  world.alltoall(send_counts.data(), recv_counts.data(), 1);
  std::vector<float> send, recv;
  for (int q = 0; q < P; ++q) {
    const size_t at = send.size();
    send.resize(at + words[q].size());
    std::memcpy(send.data() + at, words[q].data(), words[q].size() * 4);
  }
  int64_t total = 0;
  for (int64_t c : recv_counts) total += c;
  recv.resize(static_cast<size_t>(total));
  world.alltoallv(send.data(), send_counts.data(), recv.data(), recv_counts.data());
  std::vector<std::vector<uint32_t>> out(static_cast<size_t>(P));
  size_t at = 0;
  for (int q = 0; q < P; ++q) {
    out[q].resize(static_cast<size_t>(recv_counts[q]));
    std::memcpy(out[q].data(), recv.data() + at, size_t(recv_counts[q]) * 4);
    at += size_t(recv_counts[q]);
  }
  return out;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string xxh64_hex(const std::string& bytes) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(XXH64(bytes.data(), bytes.size(), 0)));
  return hex;
}

const FileEntry* primary_entry(const Manifest& m, int64_t rank) {
  for (const FileEntry& f : m.files)
    if (!f.peer_copy && f.rank == rank) return &f;
  return nullptr;
}

// Coverage along the chain and what the run needs (verify_checkpoint's last checks); "" when all is well.
std::string chain_tensors_problem(const std::vector<Manifest>& chain, const std::string& name,
                                  const std::vector<TensorExpectation>* expected) {
  try {
    std::map<std::string, TensorSummary> base;
    for (const Manifest& m : chain) {
      const std::map<std::string, TensorSummary> these = check_coverage(m, m.chain.back());
      if (&m == &chain.front()) base = these;
      for (const auto& [tensor, t] : these)
        if (!base.count(tensor) || base[tensor].dtype != t.dtype || base[tensor].global_shape != t.global_shape)
          MOE_BAD_INPUT("checkpoint " << m.chain.back() << " holds other tensors than the base of its chain");
      if (these.size() != base.size())
        MOE_BAD_INPUT("checkpoint " << m.chain.back() << " holds other tensors than the base of its chain");
    }
    if (expected) check_expected(check_coverage(chain.back(), name), *expected, name);
    return "";
  } catch (const Error& e) {
    return e.message();
  }
}

// What this host holds: each committed checkpoint's manifest text and the files that verify here.
json held_here(const std::string& local_root) {
  json mine = json::object();
  for (const std::string& dir : list_checkpoints(local_root)) {
    Manifest m;
    try {
      m = read_manifest(dir);  // the type and size of manifest.json checked before it is read
      check_manifest(m, fs::path(dir).filename().string(), (fs::path(dir) / kManifestName).string());
    } catch (const std::exception&) {
      continue;
    }
    const std::string text = read_text(fs::path(dir) / kManifestName);
    json files = json::object();
    for (const FileEntry& f : m.files) {
      const fs::path path = fs::path(dir) / f.name;
      const FileEntry* content = f.peer_copy ? primary_entry(m, f.rank) : &f;
      std::string problem;
      if (!content || !check_file(path.string(), f, &problem)) continue;
      try {
        check_shard(path.string(), *content, m);
      } catch (const Error&) {
        continue;
      }
      files[f.name] = path.string();
    }
    mine[fs::path(dir).filename().string()] = {{"manifest", text}, {"files", files}};
  }
  return mine;
}

}  // namespace

std::optional<DistributedChoice> find_newest_distributed(Communicator& world, const std::string& local_root,
                                                         bool node_leader, std::vector<std::string>* notes,
                                                         const std::vector<TensorExpectation>* expected,
                                                         const std::optional<std::string>& run_id) {
  const json mine = node_leader ? held_here(local_root) : json::object();
  const std::vector<std::string> all = allgather_strings(world, mine.dump());
  std::vector<json> held;
  for (const std::string& text : all) held.push_back(json::parse(text));

  // Newest first, the first whose chain is complete somewhere; the same decision on every rank.
  std::map<int64_t, std::string, std::greater<>> by_step;
  std::map<std::string, std::string> manifest_text;
  for (const json& h : held)
    for (const auto& [name, entry] : h.items()) {
      by_step[step_of_dir(name)] = name;
      manifest_text.emplace(name, entry["manifest"].get<std::string>());
    }
  for (const auto& [step, name] : by_step) {
    DistributedChoice c;
    c.dir_name = name;
    std::string why;
    const Manifest head = manifest_from_json(json::parse(manifest_text[name]), name);
    why = other_run(head, run_id);
    for (size_t ci = 0; ci < head.chain.size() && why.empty(); ++ci) {
      const std::string& member = head.chain[ci];
      auto text = manifest_text.find(member);
      if (text == manifest_text.end()) {
        why = "no host holds " + member + " of its chain";
        break;
      }
      if (member != name && xxh64_hex(text->second) != head.chain_manifests[ci]) {
        why = member + " on the hosts is not the checkpoint it was computed from";
        break;
      }
      Manifest m = manifest_from_json(json::parse(text->second), member);
      std::vector<int64_t> holders;
      std::vector<std::string> paths;
      for (const FileEntry& f : m.files) {
        int64_t holder = -1;
        std::string path;
        if (!f.peer_copy) {
          char peer_name[40];
          std::snprintf(peer_name, sizeof peer_name, "peer-of-rank-%05lld.h5", static_cast<long long>(f.rank));
          for (const std::string& candidate : {f.name, std::string(peer_name)}) {
            for (size_t r = 0; r < held.size() && holder < 0; ++r)
              if (held[r].contains(member) && held[r][member]["files"].contains(candidate))
                holder = int64_t(r), path = held[r][member]["files"][candidate].get<std::string>();
            if (holder >= 0) {
              if (candidate != f.name)
                c.notes.push_back(member + "/" + f.name + " is on no host; using the peer copy held by rank " +
                                  std::to_string(holder));
              break;
            }
          }
          if (holder < 0) {
            why = member + "/" + f.name + " is held by no host, nor its peer copy";
            break;
          }
        }
        holders.push_back(holder);
        paths.push_back(path);
      }
      c.chain.push_back(std::move(m));
      c.holder.push_back(std::move(holders));
      c.path.push_back(std::move(paths));
    }
    if (expected)  // what a model reads: the parts of stacked tensors as their slabs (stacked.h)
      for (Manifest& m : c.chain) stack_legacy_parts(m);
    if (why.empty()) why = chain_tensors_problem(c.chain, name, expected);
    if (why.empty()) {
      notes->insert(notes->end(), c.notes.begin(), c.notes.end());
      return c;
    }
    notes->push_back("skipped " + name + ": " + why);
  }
  return std::nullopt;
}

void load_pieces_distributed(Communicator& world, const DistributedChoice& choice, const std::vector<Piece>& pieces) {
  const int P = world.size();
  // A request: (chain member, file, dataset, first element, count, piece); asked of the file's holder.
  struct Request {
    int64_t chain, file, dataset, lo, count, piece;
  };
  std::vector<std::vector<Request>> asked(static_cast<size_t>(P));
  std::vector<std::vector<int64_t>> covered(pieces.size(), std::vector<int64_t>(choice.chain.size(), 0));
  for (size_t pi = 0; pi < pieces.size(); ++pi) {
    const Piece& p = pieces[pi];
    for (size_t c = 0; c < choice.chain.size(); ++c)
      for (size_t f = 0; f < choice.chain[c].files.size(); ++f) {
        const FileEntry& fe = choice.chain[c].files[f];
        if (fe.peer_copy) continue;
        for (size_t d = 0; d < fe.datasets.size(); ++d) {
          const DatasetEntry& de = fe.datasets[d];
          if (de.tensor != p.tensor) continue;
          const Need n = need_of(p, de, choice.chain[c].chain.back());
          if (n.runs.empty()) continue;
          asked[choice.holder[c][f]].push_back({int64_t(c), int64_t(f), int64_t(d), n.lo, n.hi - n.lo, int64_t(pi)});
          covered[pi][c] += n.elements;
        }
      }
    for (size_t c = 0; c < choice.chain.size(); ++c)
      if (covered[pi][c] != p.count())
        MOE_BAD_INPUT("checkpoint " << choice.dir_name << " holds " << covered[pi][c] << " of the " << p.count()
                                    << " elements of " << p.tensor << " this rank needs; it does not fit this run");
  }
  // Requests out, as words.
  std::vector<std::vector<uint32_t>> request_words(static_cast<size_t>(P));
  for (int q = 0; q < P; ++q)
    for (const Request& r : asked[q])
      for (int64_t v : {r.chain, r.file, r.dataset, r.lo, r.count}) {
        request_words[q].push_back(uint32_t(uint64_t(v)));
        request_words[q].push_back(uint32_t(uint64_t(v) >> 32));
      }
  const auto requests = exchange_words(world, request_words);
  // Serve them from the local disk.
  std::map<std::string, std::unique_ptr<ShardReader>> readers;
  std::vector<std::vector<uint32_t>> replies(static_cast<size_t>(P));
  for (int q = 0; q < P; ++q)
    for (size_t i = 0; i + 10 <= requests[q].size(); i += 10) {
      int64_t v[5];
      for (int k = 0; k < 5; ++k)
        v[k] = int64_t(uint64_t(requests[q][i + 2 * k]) | (uint64_t(requests[q][i + 2 * k + 1]) << 32));
      const DatasetEntry& de = choice.chain[v[0]].files[v[1]].datasets[v[2]];
      const std::string& path = choice.path[v[0]][v[1]];
      auto& reader = readers[path];
      if (!reader) reader = std::make_unique<ShardReader>(path);
      const std::vector<uint8_t> span = read_span(*reader, de, v[3], v[3] + v[4]);
      const size_t at = replies[q].size();
      replies[q].resize(at + span.size() / 4);
      std::memcpy(replies[q].data() + at, span.data(), span.size());
    }
  const auto answers = exchange_words(world, replies);
  // Apply in the order asked: the base's values first, then each delta's XOR, along the chain.
  std::vector<std::pair<int64_t, Request>> ordered;
  for (int q = 0; q < P; ++q)
    for (const Request& r : asked[q]) ordered.push_back({q, r});
  std::vector<size_t> cursor(static_cast<size_t>(P), 0);
  std::vector<std::vector<std::pair<const uint32_t*, Request>>> by_chain(choice.chain.size());
  for (const auto& [q, r] : ordered) {
    const Piece& p = pieces[r.piece];
    const int64_t words = r.count * int64_t(dtype_size(p.dtype) / 4);
    by_chain[r.chain].push_back({answers[q].data() + cursor[q], r});
    cursor[q] += size_t(words);
  }
  for (size_t c = 0; c < by_chain.size(); ++c)
    for (const auto& [data, r] : by_chain[c]) {
      const Piece& p = pieces[r.piece];
      const DatasetEntry& de = choice.chain[r.chain].files[r.file].datasets[r.dataset];
      place(p, need_of(p, de, choice.dir_name), reinterpret_cast<const uint8_t*>(data), de.xor_delta);
    }
}

}  // namespace moe::ckpt
