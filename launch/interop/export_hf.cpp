// `moe export hf`: see export_hf.h and docs/interop.md.
#include "launch/interop/export_hf.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>

#include "core/dtype.h"
#include "core/error.h"
#include "launch/interop/checkpoint_model.h"
#include "launch/interop/hf_architectures.h"
#include "launch/interop/hf_tokenizer.h"
#include "launch/interop/safetensors.h"
#include "launch/run/output_dir.h"

namespace moe {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// The files an export writes: all that --overwrite may replace.
bool export_file_name(const std::string& name) {
  static const std::set<std::string> fixed = {
      "config.json",           "generation_config.json",  "tokenizer.json",
      "tokenizer_config.json", "special_tokens_map.json", "model.safetensors.index.json",
      "model.safetensors"};
  static const std::regex shard(R"(model-\d{5}-of-\d{5}\.safetensors)");
  return fixed.count(name) > 0 || std::regex_match(name, shard);
}

// What --out is now: absent, an empty directory, or one holding only a previous export's files (--overwrite).
enum class OutState { Absent, Empty, PreviousExport };

OutState check_out(const ExportHfOptions& o, const fs::path& out) {
  std::error_code ec;
  const fs::file_status status = fs::symlink_status(out, ec);
  if (!fs::exists(status)) return OutState::Absent;
  if (!fs::is_directory(status))
    MOE_BAD_INPUT("--out " << o.out << " exists and is not a directory; expected a new or empty directory");
  bool empty = true;
  for (const fs::directory_entry& entry : fs::directory_iterator(out, ec)) {
    empty = false;
    const std::string name = entry.path().filename().string();
    if (!o.overwrite)
      MOE_BAD_INPUT("--out " << o.out << " is not empty (it holds " << name
                             << "); pass --overwrite to replace a previous export there");
    if (!export_file_name(name) || !fs::is_regular_file(entry.symlink_status(ec)))
      MOE_BAD_INPUT("--out " << o.out << " holds " << name
                             << ", which is not a file an export writes; --overwrite replaces only a previous export "
                                "(config.json, *.safetensors, tokenizer files), so nothing was written");
  }
  if (ec) MOE_BAD_INPUT("--out " << o.out << ": cannot read the directory (" << ec.message() << ")");
  return empty ? OutState::Empty : OutState::PreviousExport;
}

std::vector<double> router_taus(const CheckpointModel& checkpoint) {
  const Config& c = checkpoint.config;
  std::vector<double> taus(size_t(c.model.layers), 1.0);
  for (int64_t l = 0; l < c.model.layers; ++l)
    if (c.moe.num_experts > 0 && l % c.moe.every == c.moe.every - 1) taus[size_t(l)] = router_tau(checkpoint, l);
  return taus;
}

// The architecture's map of the checkpoint, checked against it before anything is written: every source present
// with its shape, every parameter of the checkpoint exported or dropped for a stated reason.
HfModel plan(const ExportHfOptions& o, const CheckpointModel& checkpoint) {
  const Config& c = checkpoint.config;
  // Checked first: a refusal names the config key, not a tensor the mapping would miss.
  HfModel model = hf_model(c, std::vector<double>(size_t(c.model.layers), 1.0), o.arch);
  model = hf_model(c, router_taus(checkpoint), o.arch);
  std::set<std::string> used;
  for (const HfTensor& t : model.tensors) {
    if (t.source.empty()) continue;  // a constant
    if (checkpoint.shape(t.source) != t.source_shape)
      MOE_BAD_INPUT("checkpoint " << checkpoint.dir << ": tensor " << t.source << " has shape "
                                  << json(checkpoint.shape(t.source)).dump() << " but its config makes it "
                                  << json(t.source_shape).dump() << "; nothing written");
    used.insert(t.source);
  }
  for (const auto& [name, why] : model.dropped) used.insert(name);
  for (const auto& [tensor, info] : checkpoint.tensors)
    if (tensor.rfind("params/", 0) == 0 && !used.count(tensor))
      MOE_BAD_INPUT("checkpoint " << checkpoint.dir << " holds " << tensor << ", which " << model.architecture
                                  << " has no place for; nothing written");
  return model;
}

// "2GB", "500MB", "64KiB", "1000": bytes.
int64_t parse_size(const std::string& text) {
  static const std::regex form(R"((\d{1,15})\s*(|B|KB|MB|GB|KiB|MiB|GiB))");
  std::smatch m;
  if (!std::regex_match(text, m, form) || std::stoll(m[1]) == 0)
    MOE_BAD_INPUT("--max-shard-size " << text << ": expected a positive size such as 2GB, 500MB or 64KiB");
  const std::map<std::string, int64_t> units = {{"", 1},          {"B", 1},           {"KB", 1000},
                                                {"MB", 1000000},  {"GB", 1000000000}, {"KiB", 1 << 10},
                                                {"MiB", 1 << 20}, {"GiB", 1 << 30}};
  const int64_t n = std::stoll(m[1]), unit = units.at(m[2]);
  if (n > (int64_t{1} << 50) / unit) MOE_BAD_INPUT("--max-shard-size " << text << ": too large");
  return n * unit;
}

// tokenizer.json and tokenizer_config.json of the model's tokenizer, made (and refused) before anything is written;
// a BPE's end-of-document becomes the model's EOS token.
struct ExportTokenizer {
  json tokenizer, config;
};
ExportTokenizer export_tokenizer(const CheckpointModel& checkpoint, HfModel& model) {
  const ModelTokenizer t = model_tokenizer(checkpoint);
  if (t.kind == "byte") return {byte_tokenizer_json(), byte_tokenizer_config()};
  const data::BpeTokenizer bpe = load_model_bpe(t);
  if (bpe.vocab() > checkpoint.config.model.vocab)
    MOE_BAD_INPUT(t.file << " has " << bpe.vocab()
                         << " ids, more than model.vocab = " << checkpoint.config.model.vocab);
  ExportTokenizer e{bpe_tokenizer_json(bpe, t.file), bpe_tokenizer_config()};
  model.config["eos_token_id"] = data::kEndOfDocument;
  model.generation_config["eos_token_id"] = data::kEndOfDocument;
  return e;
}

// Whether model.tensors[i] is the last of its name: an exported tensor made of several sources is the entries of one
// name next to each other (Op::Rows), each filling its rows.
bool last_of_name(const HfModel& model, size_t i) {
  return i + 1 == model.tensors.size() || model.tensors[i + 1].name != model.tensors[i].name;
}

struct Shard {
  std::string file;
  std::vector<size_t> tensors;  // indices into HfModel::tensors (several for a tensor of several sources)
  std::vector<SafetensorsEntry> entries;
};

std::vector<Shard> shards_of(const HfModel& model, const std::string& dtype, int64_t max_bytes) {
  std::vector<Shard> shards(1);
  int64_t bytes = 0;
  for (size_t i = 0; i < model.tensors.size(); ++i) {
    const HfTensor& t = model.tensors[i];
    const SafetensorsEntry e{t.name, dtype, t.shape};
    if (i > 0 && model.tensors[i - 1].name == t.name) {  // another part of the entry just added
      shards.back().tensors.push_back(i);
      continue;
    }
    if (!shards.back().entries.empty() && bytes + e.bytes() > max_bytes) shards.emplace_back(), bytes = 0;
    shards.back().tensors.push_back(i), shards.back().entries.push_back(e);
    bytes += e.bytes();
  }
  for (size_t s = 0; s < shards.size(); ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    shards[s].file = name;
  }
  return shards;
}

void write_json(const fs::path& path, const json& value) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file << value.dump(2) << "\n";
  file.close();
  if (!file) MOE_FAIL("writing " << path.string() << ": " << std::strerror(errno));
}

// Writes the shards; returns the bytes of tensor data written. Each checkpoint tensor is read once: the tensors
// of one source are consecutive.
int64_t write_shards(const fs::path& dir, const std::vector<Shard>& shards, const HfModel& model,
                     const CheckpointModel& checkpoint, bool bf16, std::ostream& log) {
  std::string source_name;
  std::vector<float> source, values;
  std::vector<uint16_t> halves;
  int64_t data = 0;
  for (const Shard& shard : shards) {
    SafetensorsWriter writer((dir / shard.file).string(), shard.entries, {{"format", "pt"}});
    for (size_t i : shard.tensors) {
      const HfTensor& t = model.tensors[i];
      if (!t.source.empty() && t.source != source_name)
        source = read_tensor(checkpoint, t.source), source_name = t.source;
      int64_t n = 1;
      for (int64_t d : t.shape) n *= d;
      values.resize(size_t(n));
      fill_hf_tensor(t, source.data(), values.data());
      if (!last_of_name(model, i)) continue;  // the next entries fill the rest of `values`
      if (bf16) {
        halves.resize(values.size());
        for (size_t k = 0; k < values.size(); ++k) halves[k] = float_to_bf16(values[k]).bits;
        writer.write(t.name, halves.data(), halves.size() * 2);
        data += int64_t(halves.size()) * 2;
      } else {
        writer.write(t.name, values.data(), values.size() * 4);
        data += int64_t(values.size()) * 4;
      }
    }
    writer.close();
    log << "  " << shard.file << ": " << shard.entries.size() << " tensors, " << writer.size() << " bytes\n";
  }
  return data;
}

json index_of(const std::vector<Shard>& shards, int64_t data_bytes) {
  json weight_map = json::object();
  for (const Shard& shard : shards)
    for (const SafetensorsEntry& e : shard.entries) weight_map[e.name] = shard.file;
  return {{"metadata", {{"total_size", data_bytes}}}, {"weight_map", weight_map}};
}

// Moves the complete directory into place; a previous export there is removed only after.
void publish(const fs::path& partial, const fs::path& out, OutState state) {
  std::error_code ec;
  if (state == OutState::Empty) fs::remove(out, ec);  // an empty directory: the rename replaces nothing
  if (state != OutState::PreviousExport) {
    if (::rename(partial.c_str(), out.c_str()) != 0)
      MOE_BAD_INPUT("--out " << out.string() << ": cannot create it (" << std::strerror(errno)
                             << "; did something appear there meanwhile?)");
    return;
  }
  const fs::path old = out.parent_path() / ("." + out.filename().string() + ".old-" + std::to_string(::getpid()));
  fs::rename(out, old);
  fs::rename(partial, out);
  for (const fs::directory_entry& entry : fs::directory_iterator(old, ec))
    if (export_file_name(entry.path().filename().string())) fs::remove(entry.path(), ec);
  fs::remove(old, ec);  // only when empty: a file that appeared meanwhile is kept
}

}  // namespace

CLI::App* add_export_command(CLI::App& app, ExportHfOptions& o) {
  CLI::App* exp = app.add_subcommand("export", "Export a checkpoint's model to another format (docs/interop.md).");
  exp->require_subcommand(1);
  CLI::App* hf = exp->add_subcommand(
      "hf",
      "Write a Hugging Face model directory (safetensors shards and their index, config.json, "
      "generation_config.json, tokenizer.json) that transformers loads with AutoModelForCausalLM and AutoTokenizer. "
      "MixtralForCausalLM (multi-head attention, softmax top-k routing, every layer MoE, no shared experts), else "
      "Qwen2MoeForCausalLM (dense layers by moe.every, shared experts, unnormalised gates), else Glm4MoeForCausalLM "
      "(sigmoid scores with the balancing bias, shared experts, dense first layers), else DeepseekV3ForCausalLM (the "
      "same with latent attention and its norms: model.attention = mla, model.mla.norms = true); what none can "
      "express is refused "
      "(exit 2, nothing written). The exported model is the dropless evaluation model; tau is folded "
      "into the router.");
  hf->add_option("PATH", o.path,
                 "A run directory, a checkpoint root or one checkpoint directory; a run directory or root means its "
                 "newest checkpoint")
      ->required();
  hf->add_option("--out", o.out, "The directory to write (new or empty; see --overwrite)")->required();
  hf->add_option("--arch", o.arch,
                 "auto (the first of Mixtral, Qwen2-MoE, GLM-4-MoE and DeepSeek-V3 that expresses the config), "
                 "mixtral, qwen2_moe, glm4_moe or deepseek_v3")
      ->default_val("auto");
  hf->add_option("--dtype", o.dtype, "Tensor dtype: fp32, or bf16 (rounded to nearest even)")
      ->default_val("fp32")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  hf->add_option("--max-shard-size", o.max_shard_size,
                 "Start a new safetensors file where the next tensor would take one past this size: bytes, or with "
                 "KB, MB, GB (powers of 1000) or KiB, MiB, GiB; a larger tensor gets a file of its own")
      ->default_val("2GB");
  hf->add_flag("--overwrite", o.overwrite, "Replace a previous export in --out (refused when it holds any other file)");
  return hf;
}

void run_export_hf(const ExportHfOptions& o, std::ostream& log) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t max_shard_bytes = parse_size(o.max_shard_size);
  const fs::path out = output_directory(o.out, "--out");
  const OutState state = check_out(o, out);
  const CheckpointModel checkpoint = open_checkpoint_model(o.path, log);
  HfModel model = plan(o, checkpoint);
  const ExportTokenizer tokenizer = export_tokenizer(checkpoint, model);
  const bool bf16 = o.dtype == "bf16";
  const std::vector<Shard> shards = shards_of(model, bf16 ? "BF16" : "F32", max_shard_bytes);
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  const fs::path partial = parent / ("." + out.filename().string() + ".partial-" + std::to_string(::getpid()));
  log << "exporting step " << checkpoint.step << " of " << checkpoint.dir << " as " << model.architecture << " ("
      << o.dtype << ", " << model.tensors.size() << " tensors, " << shards.size() << " safetensors file(s))\n";
  int64_t data = 0;
  try {
    fs::create_directory(partial);
    data = write_shards(partial, shards, model, checkpoint, bf16, log);
    write_json(partial / "model.safetensors.index.json", index_of(shards, data));
    json config = model.config;
    config["dtype"] = bf16 ? "bfloat16" : "float32";
    write_json(partial / "config.json", config);
    write_json(partial / "generation_config.json", model.generation_config);
    write_json(partial / "tokenizer.json", tokenizer.tokenizer);
    write_json(partial / "tokenizer_config.json", tokenizer.config);
    publish(partial, out, state);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(partial, ec);
    throw;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  char figures[160];
  std::snprintf(figures, sizeof figures, "%.1f MB of tensors in %.2f s (%.1f MB/s, reading the checkpoint included)",
                double(data) / 1e6, seconds, double(data) / 1e6 / seconds);
  log << "wrote " << o.out << ": " << figures << "\n";
  for (const auto& [name, why] : model.dropped) log << "  not exported: " << name << " (" << why << ")\n";
}

}  // namespace moe
