// Verifying a checkpoint: the one routine (verify_checkpoint) that `moe ckpt`, `--resume auto` and
// `--resume PATH` share, and the checks it is made of. Nothing is opened before its type is known
// (lstat), nothing is hashed before its size is known, and every field a load relies on is compared with
// what the HDF5 file holds, so a consistent-looking foreign file is refused instead of loaded.
#include "checkpoint/verify.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "checkpoint/checkpointer.h"
#include "checkpoint/detail.h"
#include "checkpoint/stacked.h"
#include "core/error.h"
#include "parallel/strings.h"

namespace moe::ckpt {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string shape_text(const std::vector<int64_t>& shape) { return json(shape).dump(); }

bool all_digits(const std::string& s) { return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos; }

bool is_xxh64_text(const std::string& s) {
  return s.size() == 16 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

// Elements of a global shape, or -1 when a dimension is negative or the product overflows.
int64_t checked_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return -1;
  return n;
}

const char* file_type_name(mode_t mode) {
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// A tensor's global name: parts separated by '/', none empty, no '#' (it separates a dataset's offset).
bool valid_tensor_name(const std::string& t) {
  if (t.empty() || t.front() == '/' || t.back() == '/' || t.find("//") != std::string::npos) return false;
  return t.find('#') == std::string::npos && t.find('\0') == std::string::npos;
}

void check_dataset_entry(const DatasetEntry& d, const Manifest& m, const std::string& where) {
  if (!valid_tensor_name(d.tensor)) MOE_BAD_INPUT(where << ": tensor name '" << d.tensor << "' is not a global name");
  if (d.dtype == DType::U32) MOE_BAD_INPUT(where << ", " << d.dataset << ": dtype u32 is no tensor's (f32, f64, i64)");
  const int64_t n = checked_numel(d.global_shape());
  if (n < 0)
    MOE_BAD_INPUT(where << ", " << d.dataset << ": global shape " << shape_text(d.global_shape()) << " is invalid");
  if (checked_numel(d.slab.shape) < 0)
    MOE_BAD_INPUT(where << ", " << d.dataset << ": shape " << shape_text(d.slab.shape) << " is invalid");
  const std::string problem = d.slab.problem();
  if (!problem.empty())
    MOE_BAD_INPUT(where << ", " << d.dataset << ": " << d.slab.text() << ": " << problem << " of " << n << " elements");
  // A second piece of a tensor in one file is named by the tensor's index of its first element.
  const int64_t first = d.slab.first_global_index();
  if (d.dataset != d.tensor && d.dataset != d.tensor + "#" + std::to_string(first))
    MOE_BAD_INPUT(where << ": dataset '" << d.dataset << "' is neither " << d.tensor << " nor " << d.tensor << "#"
                        << first);
  if (d.xor_delta && m.kind != "delta")
    MOE_BAD_INPUT(where << ", " << d.dataset << ": an XOR delta in a " << m.kind << " checkpoint");
}

// File names as the writer gives them (rank-NNNNN.h5, peer-of-rank-NNNNN.h5): nothing outside the directory.
void check_file_entries(const Manifest& m, const std::string& origin) {
  std::set<std::string> names;
  std::set<int64_t> primaries;
  for (const FileEntry& f : m.files) {
    const fs::path name(f.name);
    if (name.is_absolute() || f.name.find('/') != std::string::npos || f.name == ".." || f.name == "." ||
        f.name.empty())
      MOE_BAD_INPUT(origin << ": file name '" << f.name
                           << "' points outside the checkpoint directory; a checkpoint's files are named "
                              "rank-NNNNN.h5 or peer-of-rank-NNNNN.h5 inside it");
    const std::string expected = f.rank < 0    ? ""
                                 : f.peer_copy ? detail::peer_file_name(f.rank)
                                               : rank_file_name(f.rank);
    if (f.name != expected)
      MOE_BAD_INPUT(origin << ": file name '" << f.name << "' of rank " << f.rank << " is not the writer's ("
                           << (expected.empty() ? "no name: negative rank" : expected) << ")");
    if (!names.insert(f.name).second) MOE_BAD_INPUT(origin << ": file " << f.name << " is listed twice");
    if (f.size < 0 || !is_xxh64_text(f.xxh64))
      MOE_BAD_INPUT(origin << ": file " << f.name << " has a malformed size or xxh64");
    if (f.peer_copy && !f.datasets.empty())
      MOE_BAD_INPUT(origin << ": the peer copy " << f.name << " lists datasets of its own");
    if (!f.peer_copy) primaries.insert(f.rank);
    for (const DatasetEntry& d : f.datasets) check_dataset_entry(d, m, origin + ", file " + f.name);
  }
  for (const FileEntry& f : m.files)
    if (f.peer_copy && !primaries.count(f.rank))
      MOE_BAD_INPUT(origin << ": the peer copy " << f.name << " is a copy of no file the manifest lists");
}

}  // namespace

int64_t step_of_checkpoint_name(const std::string& name) {
  if (name.rfind("step-", 0) != 0 || !all_digits(name.substr(5)) || name.size() > 5 + 18) return -1;
  const int64_t step = std::stoll(name.substr(5));
  return checkpoint_name(step) == name ? step : -1;
}

std::string checkpoint_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

std::string rank_file_name(int64_t rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05lld.h5", static_cast<long long>(rank));
  return buf;
}

void check_manifest(const Manifest& m, const std::string& dir_name, const std::string& origin) {
  const int64_t named = step_of_checkpoint_name(dir_name);
  if (named < 0) MOE_BAD_INPUT(origin << ": the directory name " << dir_name << " is not step-NNNNNNNN");
  if (m.step != named)
    MOE_BAD_INPUT(origin << ": step " << m.step << ", but the directory is " << dir_name << " (step " << named
                         << "): the manifest was edited or belongs elsewhere");
  if (m.chain.empty() || m.chain.back() != dir_name)
    MOE_BAD_INPUT(origin << ": its chain does not end in its own directory " << dir_name);
  if (m.kind != "full" && m.kind != "delta") MOE_BAD_INPUT(origin << ": kind '" << m.kind << "' is not full or delta");
  if ((m.kind == "full") != (m.chain.size() == 1))
    MOE_BAD_INPUT(origin << ": kind " << m.kind << " with a chain of " << m.chain.size()
                         << " (a full checkpoint's chain is itself alone, a delta's longer)");
  if (m.chain_manifests.size() + 1 != m.chain.size())
    MOE_BAD_INPUT(origin << ": " << m.chain_manifests.size() << " chain_manifests for a chain of " << m.chain.size()
                         << "; its manifest does not identify the checkpoints its chain needs");
  for (const std::string& h : m.chain_manifests)
    if (!is_xxh64_text(h)) MOE_BAD_INPUT(origin << ": chain_manifests entry '" << h << "' is not an xxh64");
  int64_t previous = -1;
  for (const std::string& name : m.chain) {
    const int64_t step = step_of_checkpoint_name(name);
    if (step <= previous)
      MOE_BAD_INPUT(origin << ": chain member '" << name << "' is not a checkpoint of a step after the one before it");
    previous = step;
  }
  check_file_entries(m, origin);
}

bool check_file(const std::string& path, const FileEntry& f, std::string* problem) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    *problem = errno == ENOENT ? std::string("missing") : std::string("cannot stat: ") + std::strerror(errno);
    return false;
  }
  if (!S_ISREG(st.st_mode)) {
    *problem = std::string(file_type_name(st.st_mode)) + ", not a regular file";
    return false;
  }
  if (int64_t(st.st_size) != f.size) {
    *problem = "size " + std::to_string(st.st_size) + ", manifest says " + std::to_string(f.size);
    return false;
  }
  int64_t size = 0;
  std::string h;
  try {
    h = file_xxh64(path, &size);
  } catch (const Error& e) {
    *problem = e.message();
    return false;
  }
  if (size != f.size) {
    *problem = "size " + std::to_string(size) + " when read, manifest says " + std::to_string(f.size);
    return false;
  }
  if (h != f.xxh64) {
    *problem = "checksum " + h + ", manifest says " + f.xxh64;
    return false;
  }
  return true;
}

void check_shard(const std::string& path, const FileEntry& content, const Manifest& m) {
  const ShardReader reader(path);
  const std::string step = reader.attribute("step");
  if (step != std::to_string(m.step))
    MOE_BAD_INPUT("checkpoint shard " << path << " says step '" << step << "', its manifest says step " << m.step
                                      << ": the file belongs to another checkpoint");
  std::set<std::string> listed;
  for (const DatasetEntry& d : content.datasets) {
    listed.insert(d.dataset);
    if (!reader.has(d.dataset))
      MOE_BAD_INPUT("checkpoint shard " << path << " has no dataset " << d.dataset << " that its manifest lists");
    const DatasetInfo& info = reader.info(d.dataset);
    // An XOR delta is stored as 32-bit words: in the file, each element is `words` words, a trailing axis of
    // that size ("moe-checkpoint-1": the tensor's flattening into words); the manifest counts elements.
    const int64_t words = d.xor_delta ? int64_t(detail::dtype_size(d.dtype) / 4) : 1;
    const DType stored = d.xor_delta ? DType::U32 : d.dtype;
    Slab want = d.slab.in_words(words);
    if (m.format == 1 && d.xor_delta)
      want = Slab::flat({numel(d.global_shape()) * words}, d.slab.begin * words, d.slab.count * words);
    if (info.dtype != stored || info.numel() != want.count || info.slab != want || info.has_slab != (m.format == 2))
      MOE_BAD_INPUT("checkpoint shard " << path << ", dataset " << d.dataset << ": the file holds "
                                        << dtype_name(info.dtype) << " x " << info.numel() << " at " << info.slab.text()
                                        << (info.has_slab ? "" : " (format 1 attributes)") << ", the manifest says "
                                        << dtype_name(stored) << " x " << want.count << " at " << want.text());
  }
  for (const DatasetInfo& info : reader.datasets())
    if (!listed.count(info.name))
      MOE_BAD_INPUT("checkpoint shard " << path << " holds dataset " << info.name
                                        << " that its manifest does not list");
}

namespace {

// The pieces of one tensor hold each of its elements exactly once: as many elements as it has, and no two
// pieces sharing one. Pieces of one hyperslab (ZeRO slices of a block) are compared by their ranges; pieces
// of different hyperslabs by their intersection.
void check_tiling(const std::string& name, const std::vector<Slab>& pieces, const std::string& dir) {
  int64_t held = 0;
  std::map<std::pair<std::vector<int64_t>, std::vector<int64_t>>, std::vector<std::pair<int64_t, int64_t>>> boxes;
  for (const Slab& s : pieces) held += s.count, boxes[{s.start, s.shape}].emplace_back(s.begin, s.count);
  auto overlapping = [&](const std::string& where) {
    MOE_BAD_INPUT("checkpoint " << dir << ": tensor " << name << " has overlapping pieces (" << where << ")");
  };
  for (auto& [box, ranges] : boxes) {
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i)
      if (ranges[i].first < ranges[i - 1].first + ranges[i - 1].second)
        overlapping("elements " + std::to_string(ranges[i].first) + " of one box");
  }
  for (size_t i = 0; i < pieces.size(); ++i)
    for (size_t j = i + 1; j < pieces.size(); ++j)
      if ((pieces[i].start != pieces[j].start || pieces[i].shape != pieces[j].shape) && overlap(pieces[i], pieces[j]))
        overlapping(pieces[i].text() + " and " + pieces[j].text());
  const int64_t n = numel(pieces.front().global_shape);
  if (held != n)
    MOE_BAD_INPUT("checkpoint " << dir << ": tensor " << name << " holds " << held << " of its " << n
                                << " elements: pieces are missing");
}

}  // namespace

std::map<std::string, TensorSummary> check_coverage(const Manifest& m, const std::string& dir) {
  std::map<std::string, TensorSummary> tensors;
  std::map<std::string, std::vector<Slab>> pieces;
  for (const FileEntry& f : m.files) {
    if (f.peer_copy) continue;
    for (const DatasetEntry& d : f.datasets) {
      auto [it, fresh] = tensors.try_emplace(d.tensor, TensorSummary{d.dtype, d.global_shape()});
      if (!fresh && (it->second.dtype != d.dtype || it->second.global_shape != d.global_shape()))
        MOE_BAD_INPUT("checkpoint " << dir << ": the pieces of " << d.tensor << " disagree on dtype or global shape ("
                                    << f.name << " says " << dtype_name(d.dtype) << " " << shape_text(d.global_shape())
                                    << ")");
      pieces[d.tensor].push_back(d.slab);
    }
  }
  for (const auto& [name, p] : pieces) check_tiling(name, p, dir);
  return tensors;
}

void check_expected(const std::map<std::string, TensorSummary>& tensors, const std::vector<TensorExpectation>& expected,
                    const std::string& dir) {
  std::set<std::string> needed;
  for (const TensorExpectation& e : expected) {
    needed.insert(e.tensor);
    auto it = tensors.find(e.tensor);
    if (it == tensors.end())
      MOE_BAD_INPUT("checkpoint " << dir << " holds no tensor " << e.tensor << ", which this run needs");
    if (it->second.dtype != e.dtype || it->second.global_shape != e.global_shape)
      MOE_BAD_INPUT("checkpoint " << dir << ": tensor " << e.tensor << " is " << dtype_name(it->second.dtype) << " "
                                  << shape_text(it->second.global_shape) << ", this run needs " << dtype_name(e.dtype)
                                  << " " << shape_text(e.global_shape));
  }
  for (const auto& [name, t] : tensors)
    if (!needed.count(name))
      MOE_BAD_INPUT("checkpoint " << dir << " holds tensor " << name
                                  << ", which this run's model does not have: a foreign checkpoint");
}

std::vector<TensorExpectation> gather_expectations(Communicator& world, const std::vector<TensorExpectation>& mine) {
  json text = json::array();
  for (const TensorExpectation& e : mine) text.push_back({e.tensor, dtype_name(e.dtype), e.global_shape});
  std::map<std::string, TensorExpectation> all;
  for (const std::string& rank_text : allgather_strings(world, text.dump()))
    for (const json& e : json::parse(rank_text)) {
      TensorExpectation x{e[0].get<std::string>(), dtype_from_name(e[1].get<std::string>(), "expectation"),
                          e[2].get<std::vector<int64_t>>()};
      auto [it, fresh] = all.try_emplace(x.tensor, x);
      MOE_CHECK(fresh || (it->second.dtype == x.dtype && it->second.global_shape == x.global_shape),
                "the ranks disagree on the dtype or global shape of " << x.tensor);
    }
  std::vector<TensorExpectation> out;
  for (auto& [name, e] : all) out.push_back(std::move(e));
  return out;
}

// ---- The routine -------------------------------------------------------------------------------------------

namespace {

bool is_regular(const fs::path& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// A file of `dir` that verifies, or a verified copy of it: in a replica root, or the peer copy another
// rank kept (listed in the same manifest); "" if none.
std::string verified_file(const fs::path& dir, const FileEntry& f, const Manifest& m,
                          const std::vector<std::string>& replicas, std::vector<std::string>* notes) {
  std::string problem;
  const fs::path primary = dir / f.name;
  if (check_file(primary.string(), f, &problem)) return primary.string();
  for (const std::string& replica : replicas) {
    const fs::path copy = fs::path(replica) / dir.filename() / f.name;
    std::string replica_problem;
    if (check_file(copy.string(), f, &replica_problem)) {
      notes->push_back(primary.string() + " failed verification (" + problem + "); using the replica " + copy.string());
      return copy.string();
    }
  }
  for (const FileEntry& peer : m.files) {
    if (!peer.peer_copy || peer.rank != f.rank) continue;
    const fs::path copy = dir / peer.name;
    std::string peer_problem;
    if (check_file(copy.string(), peer, &peer_problem)) {
      notes->push_back(primary.string() + " failed verification (" + problem + "); using the peer copy " +
                       copy.string());
      return copy.string();
    }
  }
  notes->push_back(primary.string() + " failed verification (" + problem +
                   ") and no replica or peer holds a good copy");
  return "";
}

// The manifest of `dir`, or (when it is unreadable) a replica's copy of it, with a note.
Manifest head_manifest(const fs::path& dir, const std::vector<std::string>& replicas, std::vector<std::string>* notes) {
  try {
    return read_manifest(dir.string());
  } catch (const Error& e) {
    for (const std::string& replica : replicas) {
      try {
        Manifest m = read_manifest((fs::path(replica) / dir.filename()).string());
        notes->push_back(e.message() + "; using the manifest of replica " + replica);
        return m;
      } catch (const Error&) {
      }
    }
    throw;
  }
}

// The directory (in the root, else a replica) of the earlier chain member `name` whose manifest.json hashes
// to `hash`: a delta is only ever restored onto the very checkpoints it was computed from.
std::string member_manifest_dir(const fs::path& dir, const std::string& name, const std::string& hash,
                                const std::vector<std::string>& replicas) {
  std::vector<fs::path> candidates = {dir.parent_path() / name};
  for (const std::string& replica : replicas) candidates.push_back(fs::path(replica) / name);
  for (const fs::path& candidate : candidates) {
    if (!is_regular(candidate / kManifestName)) continue;
    if (file_xxh64((candidate / kManifestName).string()) == hash) return candidate.string();
  }
  MOE_BAD_INPUT("checkpoint " << dir.string() << " is a delta on " << name
                              << ", but no copy of that checkpoint is the one it was computed from "
                                 "(missing, damaged or rewritten)");
}

// "a/step-1/" -> "a/step-1": the directory's own name is what the manifest is checked against.
fs::path without_trailing_slash(const std::string& text) {
  fs::path dir(text);
  while (!dir.empty() && dir.filename().empty() && dir.has_parent_path() && dir.parent_path() != dir)
    dir = dir.parent_path();
  return dir;
}

// Verifies chain member `ci` of `head` (files, HDF5 contents, coverage) and appends it to `r`.
void verify_member(const fs::path& dir, const Manifest& head, size_t ci, const std::vector<std::string>& replicas,
                   Resolved& r) {
  const std::string& name = head.chain[ci];
  const fs::path d = dir.parent_path() / name;
  Manifest m = head;
  if (ci + 1 < head.chain.size()) {
    const std::string manifest_dir = member_manifest_dir(dir, name, head.chain_manifests[ci], replicas);
    if (manifest_dir != d.string()) r.notes.push_back("using the manifest of " + manifest_dir + " for " + name);
    m = read_manifest(manifest_dir);
    check_manifest(m, name, (fs::path(manifest_dir) / kManifestName).string());
    if (!std::equal(m.chain.begin(), m.chain.end(), head.chain.begin()) || m.chain.size() != ci + 1)
      MOE_BAD_INPUT("checkpoint " << d.string() << ": its chain is not the start of " << dir.string() << "'s");
  }
  std::vector<std::string> paths;
  for (const FileEntry& f : m.files) {
    if (f.peer_copy) {
      paths.push_back("");
      continue;
    }
    const std::string p = verified_file(d, f, m, replicas, &r.notes);
    if (p.empty()) MOE_BAD_INPUT(r.notes.back());
    check_shard(p, f, m);
    paths.push_back(p);
  }
  r.chain.push_back(std::move(m));
  r.chain_dirs.push_back(d.string());
  r.paths.push_back(std::move(paths));
}

bool same_tensors(const std::map<std::string, TensorSummary>& a, const std::map<std::string, TensorSummary>& b) {
  if (a.size() != b.size()) return false;
  for (auto i = a.begin(), j = b.begin(); i != a.end(); ++i, ++j)
    if (i->first != j->first || i->second.dtype != j->second.dtype || i->second.global_shape != j->second.global_shape)
      return false;
  return true;
}

}  // namespace

std::optional<Resolved> verify_checkpoint(const std::string& dir_text, const std::vector<std::string>& replicas,
                                          std::string* why, const std::vector<TensorExpectation>* expected) {
  const fs::path dir = without_trailing_slash(dir_text);
  Resolved r;
  r.dir = dir_text;
  try {
    const Manifest head = head_manifest(dir, replicas, &r.notes);
    check_manifest(head, dir.filename().string(), (dir / kManifestName).string());
    std::map<std::string, TensorSummary> tensors;
    for (size_t ci = 0; ci < head.chain.size(); ++ci) {
      verify_member(dir, head, ci, replicas, r);
      const std::map<std::string, TensorSummary> these = check_coverage(r.chain.back(), r.chain_dirs.back());
      if (ci == 0)
        tensors = these;
      else if (!same_tensors(these, tensors))
        MOE_BAD_INPUT("checkpoint " << r.chain_dirs.back() << " holds other tensors (names, dtypes or global shapes) "
                                    << "than " << r.chain_dirs.front() << ", the base of its chain");
    }
    if (expected) {  // what a model reads: the parts of stacked tensors as their slabs (stacked.h)
      for (Manifest& m : r.chain) stack_legacy_parts(m);
      check_expected(check_coverage(r.chain.back(), r.chain_dirs.back()), *expected, dir.string());
    }
    return r;
  } catch (const Error& e) {
    *why = e.message();
    return std::nullopt;
  }
}

}  // namespace moe::ckpt
