// `moe ckpt ls|verify|info|export`: reading checkpoints through the checkpoint library (manifest,
// verify_checkpoint, ShardReader, load_pieces) and printing what they hold. Nothing here writes into a
// checkpoint root; export writes one new file next to --out and renames it into place when complete.
// Every HDF5 call happens on the calling thread (HDF5 here is a serial build).
#include "launch/commands/ckpt_command.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <vector>

#include "checkpoint/checkpointer.h"
#include "checkpoint/manifest.h"
#include "checkpoint/root.h"
#include "checkpoint/shard_file.h"
#include "core/error.h"

namespace moe {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ckpt::DatasetEntry;
using ckpt::DType;
using ckpt::FileEntry;
using ckpt::Manifest;

constexpr const char* kExpected =
    "expected a run directory, a checkpoint root (RUN/checkpoints) or a checkpoint directory "
    "(RUN/checkpoints/step-NNNNNNNN)";
constexpr const char* kPathHelp =
    "A run directory, a checkpoint root (RUN/checkpoints) or one checkpoint directory "
    "(RUN/checkpoints/step-NNNNNNNN); a run directory or root means its newest checkpoint";

int64_t dtype_bytes(DType t) { return t == DType::F64 || t == DType::I64 ? 8 : 4; }

std::string human_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  else
    std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

std::string shape_text(const std::vector<int64_t>& shape) { return json(shape).dump(); }

std::string chain_text(const Manifest& m) {
  std::string text;
  for (const std::string& name : m.chain) text += (text.empty() ? "" : " -> ") + name;
  return text;
}

std::string kind_text(const Manifest& m) {
  return m.kind == "full" ? std::string("full") : m.kind + ", base " + m.chain.front();
}

int64_t files_bytes(const Manifest& m) {
  int64_t bytes = 0;
  for (const FileEntry& f : m.files) bytes += f.size;
  return bytes;
}

// Where PATH points: the checkpoint root, and the one checkpoint directory if PATH names one.
struct Location {
  std::string root;
  std::string checkpoint;  // empty: PATH is a run directory or a root
};

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// A regular file (not a FIFO, which would block the read, nor a device); symbolic links are followed.
bool regular_file(const fs::path& path) {
  std::error_code ec;
  return fs::is_regular_file(fs::status(path, ec));
}

bool holds_checkpoint_manifest(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_regular_file(fs::symlink_status(dir / ckpt::kManifestName, ec))) return false;
  std::ifstream in(dir / ckpt::kManifestName);
  if (!in) return false;
  try {
    return json::parse(in).value("format", std::string()) == ckpt::kFormat;
  } catch (const json::exception&) {
    return false;  // a damaged manifest of a step-* directory is caught by its name
  }
}

Location locate(const std::string& path) {
  if (path.empty()) MOE_BAD_INPUT("empty PATH; " << kExpected);
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status)) MOE_BAD_INPUT(path << ": no such file or directory; " << kExpected);
  if (!fs::is_directory(status)) MOE_BAD_INPUT(path << " is not a directory; " << kExpected);
  fs::directory_iterator listing(path, ec);
  if (ec) MOE_BAD_INPUT("cannot read the directory " << path << ": " << ec.message());

  fs::path dir = fs::path(path).lexically_normal();
  // "a/b/" -> "a/b"; "." and ".." -> their real names, which say whether they are checkpoints.
  if (dir.filename().empty()) dir = dir.parent_path();
  if (dir.filename() == "." || dir.filename() == "..") dir = fs::absolute(dir).lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();
  const std::string name = dir.filename().string();
  if (starts_with(name, "step-") || starts_with(name, "tmp-step-") || holds_checkpoint_manifest(dir)) {
    const fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
    return {parent.string(), dir.string()};
  }
  for (const auto& entry : listing) {
    const std::string child = entry.path().filename().string();
    if ((entry.is_directory(ec) && (starts_with(child, "step-") || starts_with(child, "tmp-step-"))) ||
        child == ckpt::kLatestName)
      return {dir.string(), ""};
  }
  const fs::path config_path = dir / "config.json";
  if (regular_file(config_path)) {
    std::ifstream in(config_path);
    json config;
    try {
      config = json::parse(in);
    } catch (const json::exception& e) {
      MOE_BAD_INPUT(config_path.string() << ": malformed JSON (" << e.what()
                                         << "); give the checkpoint root (RUN/checkpoints) instead");
    }
    std::string sub = "checkpoints";
    if (config.contains("checkpoint") && config["checkpoint"].is_object() &&
        config["checkpoint"].value("dir", json()).is_string())
      sub = config["checkpoint"]["dir"].get<std::string>();
    return {(dir / sub).string(), ""};  // an absolute checkpoint.dir replaces the run directory
  }
  if (fs::is_directory(dir / "checkpoints", ec)) return {(dir / "checkpoints").string(), ""};
  MOE_BAD_INPUT(path << " is not a run directory, a checkpoint root or a checkpoint: it holds no config.json, "
                        "no checkpoints/, no step-* directories and no checkpoint manifest.json");
}

// The checkpoint an action works on: the one PATH names, or the newest under the root.
std::string target_checkpoint(const Location& loc, std::ostream& out) {
  if (!loc.checkpoint.empty()) return loc.checkpoint;
  const std::vector<std::string> dirs = ckpt::list_checkpoints(loc.root);
  if (dirs.empty())
    MOE_BAD_INPUT("no checkpoint under " << loc.root
                                         << " (checkpoint.every = 0, or the run has not reached its first save)");
  out << "newest checkpoint under " << loc.root << ": " << fs::path(dirs.front()).filename().string() << "\n";
  return dirs.front();
}

// A checkpoint that does not verify is bad input: the message names the file and the problem.
ckpt::Resolved verified(const std::string& dir) {
  std::string why;
  std::optional<ckpt::Resolved> r = ckpt::verify_checkpoint(dir, {}, &why);
  if (!r) MOE_BAD_INPUT("checkpoint " << dir << " does not verify: " << why);
  return *r;
}

// ---- ls ------------------------------------------------------------------------------------------------------

void run_ls(const Location& loc, std::ostream& out) {
  std::vector<std::string> dirs;
  if (loc.checkpoint.empty())
    dirs = ckpt::list_checkpoints(loc.root);
  else
    dirs.push_back(loc.checkpoint);
  const std::string latest = ckpt::read_latest(loc.root);
  std::error_code ec;
  out << "checkpoint root " << loc.root;
  if (!latest.empty())
    out << "; latest -> " << latest << (fs::is_directory(fs::path(loc.root) / latest, ec) ? "" : " (missing)");
  else
    out << "; no latest pointer";
  out << "\n";
  if (dirs.empty()) {
    out << "no checkpoints\n";
    return;
  }
  char line[512];
  std::snprintf(line, sizeof line, "%-18s %8s  %-28s %5s %11s  %-20s  %s\n", "checkpoint", "step", "kind", "files",
                "size", "created", "status");
  out << line;
  int64_t good = 0;
  for (const std::string& dir : dirs) {
    const std::string name = fs::path(dir).filename().string();
    const char* mark = name == latest ? "  (latest)" : "";
    Manifest m;
    try {
      m = ckpt::read_manifest(dir);
    } catch (const Error& e) {
      std::snprintf(line, sizeof line, "%-18s %8s  %-28s %5s %11s  %-20s  ", name.c_str(), "?", "?", "?", "?", "?");
      out << line << "NOT VERIFIED: " << e.message() << mark << "\n";
      continue;
    }
    std::string why;
    const std::optional<ckpt::Resolved> r = ckpt::verify_checkpoint(dir, {}, &why);
    const bool ok = r.has_value();
    good += ok;
    if (ok && !r->notes.empty()) {  // a damaged file with a good peer copy: loads, but not whole
      why = "verified through a copy: ";
      for (size_t i = 0; i < r->notes.size(); ++i) why += (i ? "; " : "") + r->notes[i];
    }
    std::snprintf(line, sizeof line, "%-18s %8lld  %-28s %5zu %11s  %-20s  ", name.c_str(),
                  static_cast<long long>(m.step), kind_text(m).c_str(), m.files.size(),
                  human_bytes(files_bytes(m)).c_str(), m.created.c_str());
    out << line << (!ok ? "NOT VERIFIED: " + why : why.empty() ? "verified" : why) << mark << "\n";
  }
  if (loc.checkpoint.empty()) {
    for (const auto& entry : fs::directory_iterator(loc.root, ec)) {
      const std::string name = entry.path().filename().string();
      if (starts_with(name, "tmp-step-"))
        out << name << ": not committed (a save in progress, or one cut off by a crash); resume ignores it\n";
    }
  }
  out << dirs.size() << " checkpoint(s), " << good << " verified\n";
}

// ---- verify ----------------------------------------------------------------------------------------------------

// Every stored element of the file's datasets is read (HDF5 checks the Fletcher-32 checksum of every chunk
// on the way); verify_checkpoint has matched them against the manifest. Returns the elements read.
int64_t read_every_chunk(const std::string& path, const FileEntry& f) {
  const ckpt::ShardReader reader(path);
  int64_t elements = 0;
  std::vector<uint8_t> buffer;
  for (const DatasetEntry& d : f.datasets) {
    const ckpt::DatasetInfo& info = reader.info(d.dataset);
    const int64_t block = ckpt::kShardChunkElements * 4;  // bounded memory for large tensors
    for (int64_t begin = 0; begin < info.numel(); begin += block) {
      const int64_t n = std::min(block, info.numel() - begin);
      buffer.resize(size_t(n * dtype_bytes(info.dtype)));
      reader.read(d.dataset, info.dtype, begin, n, buffer.data());
    }
    elements += info.numel();
  }
  return elements;
}

// A peer copy's entry lists no datasets: they are those of the rank's own file.
const FileEntry* primary_of(const Manifest& m, int64_t rank) {
  for (const FileEntry& f : m.files)
    if (!f.peer_copy && f.rank == rank) return &f;
  return nullptr;
}

// "" when the peer copy at `path` is a regular file of the size and xxh64 listed, holding its rank's datasets.
std::string peer_copy_problem(const std::string& path, const FileEntry& f, const FileEntry* content,
                              const Manifest& m) {
  std::string problem;
  if (!content) return "the manifest lists no file of rank " + std::to_string(f.rank) + " it would be a copy of";
  if (!ckpt::check_file(path, f, &problem)) return problem;
  try {
    ckpt::check_shard(path, *content, m);
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

void run_verify(const Location& loc, std::ostream& out) {
  const std::string dir = target_checkpoint(loc, out);
  const ckpt::Resolved r = verified(dir);  // what a load needs: sizes and xxh64 of the files of the chain
  const Manifest& head = r.chain.back();
  out << "checkpoint " << dir << ": step " << head.step << ", " << head.kind << ", chain " << chain_text(head) << "\n";
  // Damaged files that a copy stands in for: the checkpoint loads, but is not whole.
  std::vector<std::string> problems = r.notes;
  int64_t files = 0, bytes = 0, datasets = 0, elements = 0;
  for (size_t c = 0; c < r.chain.size(); ++c) {
    const Manifest& m = r.chain[c];
    const fs::path chain_dir(r.chain_dirs[c]);
    const std::string name = chain_dir.filename().string();
    const size_t tensors = ckpt::check_coverage(m, r.chain_dirs[c]).size();  // checked by verify_checkpoint
    for (size_t fi = 0; fi < m.files.size(); ++fi) {
      const FileEntry& f = m.files[fi];
      std::string path = r.paths[c][fi];
      const FileEntry* content = &f;
      out << "  " << name << "/" << f.name << ": ";
      if (f.peer_copy) {
        // verify_checkpoint looks at a peer copy only when it stands in for a damaged file.
        path = (chain_dir / f.name).string();
        content = primary_of(m, f.rank);
        const std::string problem = peer_copy_problem(path, f, content, m);
        if (!problem.empty()) {
          out << "peer copy of rank " << f.rank << " FAILED (" << problem << ")\n";
          problems.push_back(path + " (peer copy of rank " + std::to_string(f.rank) + ") failed verification (" +
                             problem + ")");
          continue;
        }
        out << "peer copy of rank " << f.rank << ", ";
      } else if (path != (chain_dir / f.name).string()) {
        out << "DAMAGED, reading its copy " << path << " instead: ";
      }
      out << f.size << " bytes, xxh64 " << f.xxh64 << " as in the manifest";
      out.flush();
      int64_t n = 0;
      try {
        n = read_every_chunk(path, *content);
      } catch (const Error&) {
        out << ": FAILED\n";
        throw;
      }
      out << "; " << content->datasets.size() << " datasets, " << n
          << " stored elements read, Fletcher-32 of every chunk ok\n";
      ++files, bytes += f.size, datasets += int64_t(content->datasets.size()), elements += n;
    }
    out << "  " << name << ": " << tensors << " tensors, each covered exactly once by its pieces\n";
  }
  if (!problems.empty()) {
    std::string text;
    for (const std::string& p : problems) text += (text.empty() ? "" : "; ") + p;
    MOE_BAD_INPUT("checkpoint " << dir << " is damaged: " << text
                                << ". Every tensor can still be read (a copy stands in where needed), so --resume "
                                   "would load it, but it has lost the redundancy of its copies");
  }
  out << "ok: " << dir << " verifies (" << r.chain.size() << " checkpoint(s) in its chain, " << files << " file(s), "
      << human_bytes(bytes) << ", " << datasets << " datasets, " << elements << " stored elements)\n";
}

// ---- info ------------------------------------------------------------------------------------------------------

std::string flat_keys(const json& j, const std::string& prefix) {
  std::string text;
  if (!j.is_object()) return j.dump();
  for (const auto& [key, value] : j.items())
    text +=
        (text.empty() ? "" : " ") + prefix + key + "=" + (value.is_string() ? value.get<std::string>() : value.dump());
  return text;
}

void run_info(const Location& loc, std::ostream& out) {
  const std::string dir = target_checkpoint(loc, out);
  const Manifest m = ckpt::read_manifest(dir);
  out << "checkpoint  " << dir << "\n"
      << "format      " << (m.format == 1 ? ckpt::kFormatV1 : ckpt::kFormat) << "\n"
      << "step        " << m.step << "\n"
      << "kind        " << kind_text(m) << "\n"
      << "chain       " << chain_text(m) << "\n"
      << "created     " << m.created << "\n"
      << "layout      " << flat_keys(m.layout, "") << "\n";
  json model = json::object();
  if (m.config.contains("model") && m.config["model"].is_object())
    for (const auto& [key, value] : m.config["model"].items()) model["model." + key] = value;
  if (m.config.contains("moe") && m.config["moe"].is_object())
    for (const char* key : {"num_experts", "top_k", "every", "expert_hidden", "shared_experts"})
      if (m.config["moe"].contains(key)) model[std::string("moe.") + key] = m.config["moe"][key];
  out << "model       " << flat_keys(model, "") << "\n"
      << "versions    " << flat_keys(m.versions, "") << "\n"
      << "files       " << m.files.size() << ", " << human_bytes(files_bytes(m)) << "\n";
  for (const FileEntry& f : m.files) {
    out << "  " << f.name << "  rank " << f.rank << ", " << f.size << " bytes, xxh64 " << f.xxh64 << ", ";
    if (f.peer_copy)
      out << "a copy of rank " << f.rank << "'s file kept by another rank\n";
    else
      out << f.datasets.size() << " datasets\n";
  }

  struct Tensor {
    DType dtype;
    std::vector<int64_t> global_shape;
    int64_t pieces = 0, xor_pieces = 0;
    std::set<std::string> files;
  };
  std::map<std::string, Tensor> tensors;
  for (const FileEntry& f : m.files) {
    if (f.peer_copy) continue;
    for (const DatasetEntry& d : f.datasets) {
      Tensor& t = tensors.try_emplace(d.tensor, Tensor{d.dtype, d.global_shape(), 0, 0, {}}).first->second;
      ++t.pieces, t.xor_pieces += d.xor_delta;
      t.files.insert(f.name);
    }
  }
  int64_t total = 0;
  size_t width = 6;
  for (const auto& [name, t] : tensors) total += ckpt::numel(t.global_shape), width = std::max(width, name.size());
  out << "tensors     " << tensors.size() << ", " << total << " elements\n\n";
  char line[512];
  std::snprintf(line, sizeof line, "%-*s  %-14s %-5s %10s %6s %5s  %s\n", int(width), "tensor", "global shape", "dtype",
                "elements", "pieces", "files", "stored as");
  out << line;
  for (const auto& [name, t] : tensors) {
    const char* stored = t.xor_pieces == 0 ? "values" : t.xor_pieces == t.pieces ? "xor delta" : "values + xor delta";
    std::snprintf(line, sizeof line, "%-*s  %-14s %-5s %10lld %6lld %5zu  %s\n", int(width), name.c_str(),
                  shape_text(t.global_shape).c_str(), ckpt::dtype_name(t.dtype),
                  static_cast<long long>(ckpt::numel(t.global_shape)), static_cast<long long>(t.pieces), t.files.size(),
                  stored);
    out << line;
  }
}

// ---- export ----------------------------------------------------------------------------------------------------

// --out can be written: its parent is a writable directory outside any checkpoint, and it does not exist
// (or --force). Returns the parent. Everything here refuses before anything is written.
fs::path check_export_target(const CkptOptions& o) {
  if (o.out.empty()) MOE_BAD_INPUT("moe ckpt export: --out FILE.h5 is required");
  std::error_code ec;
  const fs::path target(o.out);
  const std::string name = target.filename().string();
  if (name.empty() || name == "." || name == "..")
    MOE_BAD_INPUT("--out " << o.out << " names a directory; expected a file name");
  const fs::file_status status = fs::symlink_status(target, ec);
  if (fs::exists(status)) {
    if (fs::is_directory(status)) MOE_BAD_INPUT("--out " << o.out << " is a directory; expected a file name");
    if (!o.force) MOE_BAD_INPUT("--out " << o.out << " exists; pass --force to replace it");
    if (!fs::is_regular_file(status) && !fs::is_symlink(status))
      MOE_BAD_INPUT("--out " << o.out << " exists and is not a regular file; --force replaces only files");
  }
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const fs::file_status parent_status = fs::status(parent, ec);
  if (!fs::exists(parent_status))
    MOE_BAD_INPUT("--out " << o.out << ": directory " << parent.string() << " does not exist");
  if (!fs::is_directory(parent_status))
    MOE_BAD_INPUT("--out " << o.out << ": " << parent.string() << " is not a directory");
  if (::access(parent.c_str(), W_OK | X_OK) != 0)
    MOE_BAD_INPUT("--out " << o.out << ": cannot write into " << parent.string() << " (" << std::strerror(errno)
                           << ")");
  const std::string parent_name = fs::absolute(parent, ec).lexically_normal().filename().string();
  if (starts_with(parent_name, "step-") || starts_with(parent_name, "tmp-step-") || holds_checkpoint_manifest(parent))
    MOE_BAD_INPUT("--out " << o.out
                           << " is inside a checkpoint directory; checkpoints are never modified, choose "
                              "another place");
  return parent;
}

// Moves the complete file into place: without --force, never over a file that appeared meanwhile.
void publish_export(const fs::path& partial, const fs::path& target, bool force) {
  if (force) {
    fs::rename(partial, target);
    return;
  }
  if (::link(partial.c_str(), target.c_str()) != 0)
    MOE_BAD_INPUT("--out " << target.string() << ": cannot create it (" << std::strerror(errno)
                           << "); nothing was replaced (pass --force to replace an existing file)");
  std::error_code ec;
  fs::remove(partial, ec);
}

void run_export(const Location& loc, const CkptOptions& o, std::ostream& out) {
  const fs::path target(o.out);
  const fs::path parent = check_export_target(o);
  std::error_code ec;

  const std::string dir = target_checkpoint(loc, out);
  const ckpt::Resolved r = verified(dir);
  const Manifest& head = r.chain.back();
  std::map<std::string, ckpt::Piece> tensors;  // whole tensors, by name
  for (const FileEntry& f : head.files) {
    if (f.peer_copy) continue;
    for (const DatasetEntry& d : f.datasets) {
      if (!o.all && !starts_with(d.tensor, "params/")) continue;
      ckpt::Piece p;
      p.tensor = d.tensor, p.dtype = d.dtype, p.slab = ckpt::Slab::whole(d.global_shape());
      tensors.emplace(d.tensor, p);
    }
  }
  if (tensors.empty()) MOE_BAD_INPUT("checkpoint " << dir << " holds no " << (o.all ? "" : "params/ ") << "tensors");
  out << "exporting " << (o.all ? "every tensor" : "params/*") << " of step " << head.step << " from " << dir;
  if (r.chain.size() > 1) out << " (a delta: reconstructed along its chain " << chain_text(head) << ")";
  out << "\n";
  for (const std::string& note : r.notes) out << "  note: " << note << "\n";

  // Written beside --out under a name of its own, renamed into place once complete and synced.
  const fs::path partial = parent / ("." + target.filename().string() + ".partial-" + std::to_string(::getpid()));
  int64_t elements = 0;
  std::unique_ptr<ckpt::ShardWriter> writer;
  try {
    writer = std::make_unique<ckpt::ShardWriter>(partial.string());
  } catch (const Error& e) {
    MOE_BAD_INPUT("--out " << o.out << ": cannot create " << partial.string() << " (" << e.message() << ")");
  }
  try {
    writer->set_attribute("source_checkpoint", fs::absolute(dir).lexically_normal().string());
    writer->set_attribute("step", std::to_string(head.step));
    writer->set_attribute("kind", "export");
    writer->set_attribute("chain", chain_text(head));
    // Tensors in batches of bounded memory: one load_pieces call opens each file once per batch.
    constexpr int64_t kBatchBytes = int64_t{256} << 20;
    auto it = tensors.begin();
    while (it != tensors.end()) {
      std::vector<ckpt::Piece> batch;
      std::vector<std::vector<uint8_t>> buffers;
      int64_t bytes = 0;
      for (; it != tensors.end() && (batch.empty() || bytes + it->second.bytes() <= kBatchBytes); ++it) {
        buffers.emplace_back(size_t(it->second.bytes()), 0);  // zeros: the base's values are XORed in along the chain
        batch.push_back(it->second);
        batch.back().dst = buffers.back().data();
        bytes += it->second.bytes();
      }
      ckpt::load_pieces(r, batch);
      for (size_t i = 0; i < batch.size(); ++i) {
        const ckpt::Piece& p = batch[i];
        writer->write(p.tensor, p.dtype, buffers[i].data(), p.slab.global_shape, p.slab.global_shape, 0);
        out << "  " << p.tensor << "  " << shape_text(p.slab.global_shape) << "  " << ckpt::dtype_name(p.dtype) << "\n";
        elements += p.count();
      }
    }
    writer->close();
    publish_export(partial, target, o.force);
  } catch (...) {
    fs::remove(partial, ec);
    throw;
  }
  int64_t size = 0;
  size = int64_t(fs::file_size(target, ec));
  out << "wrote " << o.out << ": " << tensors.size() << " tensors, " << elements << " elements, " << human_bytes(size)
      << " (datasets under their global names, full global shape, flat_offset 0)\n";
}

}  // namespace

CLI::App* add_ckpt_command(CLI::App& app, CkptOptions& o) {
  CLI::App* ckpt = app.add_subcommand("ckpt", "Inspect, verify and export checkpoints (docs/checkpoint.md).");
  ckpt->require_subcommand(1);
  CLI::App* ls = ckpt->add_subcommand(
      "ls",
      "List the checkpoints, newest first: step, kind and chain base, files, size, created, and whether each "
      "verifies (size and xxh64 of every file of it and its chain).");
  ls->add_option("PATH", o.path, kPathHelp)->required();
  ls->callback([&o] { o.action = CkptAction::Ls; });
  CLI::App* verify = ckpt->add_subcommand(
      "verify",
      "Verify a checkpoint and its chain: sizes and xxh64 of every file, then every dataset read in full "
      "(HDF5 checks each chunk's Fletcher-32), matched against the manifest. Exit 2 if anything is wrong.");
  verify->add_option("PATH", o.path, kPathHelp)->required();
  verify->callback([&o] { o.action = CkptAction::Verify; });
  CLI::App* info = ckpt->add_subcommand(
      "info",
      "Summarise a checkpoint's manifest: step, kind, chain, layout, model config, and its tensors "
      "(global name, global shape, dtype, elements, pieces, files).");
  info->add_option("PATH", o.path, kPathHelp)->required();
  info->callback([&o] { o.action = CkptAction::Info; });
  CLI::App* exp = ckpt->add_subcommand(
      "export",
      "Write one HDF5 file holding each tensor whole (its global shape), reconstructed along the chain "
      "for a delta checkpoint.");
  exp->add_option("PATH", o.path, kPathHelp)->required();
  exp->add_option("--out", o.out, "The HDF5 file to write (refused if it exists, unless --force)")->required();
  exp->add_flag("--all", o.all, "Also the optimizer (optim/), MoE (moe/) and clipping (clip/) state, not only params/");
  exp->add_flag("--force", o.force, "Replace an existing --out file");
  exp->callback([&o] { o.action = CkptAction::Export; });
  return ckpt;
}

void run_ckpt(const CkptOptions& o, std::ostream& out) {
  const Location loc = locate(o.path);
  switch (o.action) {
    case CkptAction::Ls:
      return run_ls(loc, out);
    case CkptAction::Verify:
      return run_verify(loc, out);
    case CkptAction::Info:
      return run_info(loc, out);
    case CkptAction::Export:
      return run_export(loc, o, out);
    case CkptAction::None:
      break;
  }
  MOE_FAIL("moe ckpt: no action parsed");
}

std::string checkpoint_of_path(const std::string& path, std::ostream& out) {
  return target_checkpoint(locate(path), out);
}

}  // namespace moe
