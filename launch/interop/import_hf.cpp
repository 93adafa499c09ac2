// `moe import hf`: see import_hf.h and docs/interop.md.
#include "launch/interop/import_hf.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "checkpoint/checkpointer.h"
#include "core/backend/backend.h"
#include "core/error.h"
#include "core/philox.h"
#include "launch/interop/hf_architectures.h"
#include "launch/interop/safetensors.h"
#include "launch/run/output_dir.h"
#include "launch/run/run_dir.h"
#include "launch/train/train_setup.h"
#include "parallel/self_communicator.h"

namespace moe {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

void check_out(const std::string& out) {
  std::error_code ec;
  if (fs::exists(fs::symlink_status(output_directory(out, "--out"), ec)))
    MOE_BAD_INPUT("--out " << out << " exists; moe import hf makes a new run directory");
}

json read_hf_config(const std::string& dir) {
  const fs::path path = fs::path(dir) / "config.json";
  std::error_code ec;
  if (!fs::is_regular_file(fs::status(path, ec))) MOE_BAD_INPUT(path.string() << ": missing (or not a regular file)");
  std::ifstream in(path);
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    MOE_BAD_INPUT(path.string() << ": not JSON (" << e.what() << ")");
  }
}

// Every tensor of the mapping present with its shape, and no tensor of the directory without a place.
void check_tensors(const HfModel& model, const SafetensorsModel& files, const std::string& dir) {
  std::set<std::string> known;
  for (const HfTensor& t : model.tensors) {
    known.insert(t.name);
    if (!files.has(t.name))
      MOE_BAD_INPUT(dir << " has no tensor " << t.name << ", which " << model.architecture << " of the config has");
    const SafetensorsTensor& found = files.tensor(t.name);
    if (found.shape != t.shape)
      MOE_BAD_INPUT(dir << ": tensor " << t.name << " has shape " << json(found.shape).dump()
                        << ", but the config makes it " << json(t.shape).dump() << " from " << t.keys);
  }
  for (const std::string& name : files.names())
    if (!known.count(name))
      MOE_BAD_INPUT(dir << " holds tensor " << name << ", which has no place in the config's model");
}

// A tensor the architecture has and this project's model has not must hold what leaves the forward unchanged:
// Qwen2-MoE's shared-expert gate zero (sigmoid(0) = 1/2 for every token, undone by the doubled down projection).
void check_constants(const HfModel& model, const SafetensorsModel& files, const std::string& dir) {
  for (const HfTensor& t : model.tensors) {
    if (!t.source.empty()) continue;
    for (float v : files.read_f32(t.name))
      if (v != 0.0f)
        MOE_BAD_INPUT(dir << ": tensor " << t.name << " holds " << v
                          << "; only zeros can be imported (this project's shared experts are not gated per token)");
  }
}

// The serial trainer of the config (one rank; the checkpoint loads at any layout), which makes every tensor a
// checkpoint holds: parameters, a fresh optimizer, fresh routing state.
std::unique_ptr<Trainer> serial_trainer(const ImportHfOptions& o, Backend& backend, const std::string& run_dir) {
  TrainOptions train;
  train.config_path = o.config_path;
  train.overrides = o.overrides;
  for (const char* layout :
       {"parallel.tp=1", "parallel.pp=1", "parallel.ep=1", "parallel.dp=1", "parallel.expert_tp=1",
        "parallel.pp_layers=[]", "parallel.vpp=1", "parallel.pp_schedule=1f1b", "optim.zero=false"})
    train.overrides.push_back(layout);
  train.run_dir = run_dir;
  CheckedConfig checked = load_checked_config(train, 1);
  TrainPaths paths = train_paths(train, checked.config, 0);
  const data::Corpus corpus = load_training_corpus(checked.config);
  return std::make_unique<Trainer>(std::move(checked), std::move(paths), corpus,
                                   std::make_unique<SelfCommunicator>("world"), backend);
}

// The model's parameters from the directory's tensors, one checkpoint tensor at a time.
void load_parameters(Trainer& t, const HfModel& model, const SafetensorsModel& files) {
  std::map<std::string, std::vector<const HfTensor*>> by_source;
  for (const HfTensor& h : model.tensors) by_source[h.source].push_back(&h);
  for (const auto& [source, parts] : by_source) {
    if (source.empty()) continue;        // constants, checked by check_constants
    if (source.rfind("moe/", 0) == 0) {  // a layer's balancing bias (Glm4-MoE's e_score_correction_bias)
      for (MoeLayer<float>* layer : t.moe_layers)
        if (source == "moe/" + layer->param_prefix() + ".balancing_bias")
          for (const HfTensor* h : parts)
            unfill_hf_tensor(*h, files.read_f32(h->name).data(), layer->balancing_bias().data());
      continue;
    }
    const ParamSpec& spec = t.model->table().find(source.substr(std::string("params/").size()));
    std::vector<float> values(size_t(spec.numel));
    for (const HfTensor* h : parts) unfill_hf_tensor(*h, files.read_f32(h->name).data(), values.data());
    t.backend.copy_to_device(t.model->params() + spec.offset, values.data(), spec.numel);
  }
  t.backend.ops<float>().parameters_changed();
}

// Upcycling's noise: every element w of each expert's w1, w2, w3 becomes w (1 + std e), e a standard normal drawn
// from Philox by (train.seed, "upcycle_noise." + the tensor's name, the element's index), so the copies differ
// from the start and the same command gives the same bits.
void add_upcycle_noise(Trainer& t, double std, uint64_t seed) {
  for (const ParamSpec& spec : t.model->table().specs()) {
    if (spec.role != ParamRole::Expert) continue;  // the routed experts' w13 (w1 and w3 its parts), w2
    std::vector<float> values(size_t(spec.numel));
    t.backend.copy_to_host(values.data(), t.model->params() + spec.offset, spec.numel);
    std::vector<RngStream> rng;  // by the name of each part: "...w1" and "...w3" for w13
    for (size_t k = 0; k < std::max<size_t>(1, spec.parts.size()); ++k)
      rng.emplace_back(seed, "upcycle_noise." + spec.part_name(k));
    for (int64_t i = 0; i < spec.numel; ++i) {  // one rank: the whole tensor, i its global index
      const auto [part, index] = spec.part_of(i);
      values[size_t(i)] *= float(1.0 + std * rng[part].normal(uint64_t(index)));
    }
    t.backend.copy_to_device(t.model->params() + spec.offset, values.data(), spec.numel);
  }
  t.backend.ops<float>().parameters_changed();
}

}  // namespace

CLI::App* add_import_command(CLI::App& app, ImportHfOptions& o) {
  CLI::App* imp = app.add_subcommand("import", "Make a checkpoint from another format's model (docs/interop.md).");
  imp->require_subcommand(1);
  CLI::App* hf = imp->add_subcommand(
      "hf",
      "Make RUN_DIR/checkpoints/step-00000000 from a Hugging Face MixtralForCausalLM, Qwen2MoeForCausalLM, "
      "Glm4MoeForCausalLM or DeepseekV3ForCausalLM directory (safetensors and "
      "config.json), checked against --config; `moe train --config CONFIG --run-dir RUN_DIR` then continues from it "
      "at any layout (a fresh optimizer).");
  hf->add_option("DIR", o.dir, "The Hugging Face model directory")->required();
  hf->add_option("--config", o.config_path, "The config of the model to make (JSON, as for moe train)")
      ->required()
      ->check(CLI::ExistingFile);
  hf->add_option("--set", o.overrides, "Override a config key (repeatable), as for moe train");
  hf->add_option("--out", o.out, "The run directory to create (it must not exist)")->required();
  hf->add_flag("--upcycle", o.upcycle,
               "DIR is a dense LlamaForCausalLM: every expert of each MoE layer starts as that layer's MLP, the "
               "router as the config's seed initialises it (sparse upcycling)");
  hf->add_option("--upcycle-noise", o.upcycle_noise,
                 "With --upcycle: every expert weight w becomes w (1 + STD e), e standard normal from train.seed, so "
                 "the copies differ from the start (default 0: exact copies)")
      ->check(CLI::Range(0.0, 1.0));
  return hf;
}

void run_import_hf(const ImportHfOptions& o, std::ostream& log) {
  check_out(o.out);
  const Config config = load_config(o.config_path, o.overrides);
  if (fs::path(config.checkpoint.dir).is_absolute() || config.checkpoint.dir.find("{node}") != std::string::npos)
    MOE_BAD_INPUT("checkpoint.dir = " << config.checkpoint.dir
                                      << ": moe import hf writes its checkpoint under --out; give a relative "
                                         "checkpoint.dir without {node} (the run may change it when it continues)");
  // What the model computes: tau folded back (the router is the gate times tau), refusals as for export.
  // The architecture config.json names; what the config computes: tau folded back (the router is the gate times
  // tau), refusals as for export.
  const std::string arch = check_hf_config(read_hf_config(o.dir), (fs::path(o.dir) / "config.json").string(), config);
  if ((arch == "llama") != o.upcycle)
    MOE_BAD_INPUT(o.dir << "/config.json: model_type = " << arch
                        << (o.upcycle ? ": --upcycle takes a dense llama model" : ": a dense model needs --upcycle"));
  if (o.upcycle_noise != 0 && !o.upcycle)
    MOE_BAD_INPUT("--upcycle-noise " << o.upcycle_noise << ": noise is for upcycled experts; it needs --upcycle");
  const HfModel model =
      o.upcycle ? llama_upcycle_model(config)
                : hf_model(config, std::vector<double>(size_t(config.model.layers), config.moe.router.tau_at(0)), arch);
  const SafetensorsModel files(o.dir);
  check_tensors(model, files, o.dir);
  check_constants(model, files, o.dir);

  const std::unique_ptr<Backend> backend = make_cpu_backend(0);
  const std::unique_ptr<Trainer> t = serial_trainer(o, *backend, o.out);
  load_parameters(*t, model, files);
  if (o.upcycle_noise > 0) add_upcycle_noise(*t, o.upcycle_noise, uint64_t(config.train.seed));
  log << "importing " << o.dir << " (" << model.tensors.size() << " tensors) as step 0 of " << o.out << "\n";
  // The checkpoint records the config as given (its layout included): the run that continues from it compares
  // its own config with that one.
  const json info = {{"config", config.resolved},
                     {"layout", {{"world", 1}, {"dp", 1}, {"ep", 1}, {"zero", false}}},
                     {"versions", build_versions()},
                     {"data", t->data_provenance},
                     {"run_id", ""}};
  try {
    fs::create_directories(t->paths.ckpt_root);
    ckpt::SaveSettings save{t->paths.ckpt_root.string(), 1, 1, false};
    ckpt::Checkpointer checkpointer(save, *t->groups.world, info,
                                    [&log](const std::string& text) { log << text << "\n"; });
    checkpointer.save(0, checkpoint_pieces(t->state, true));
    checkpointer.finish();
  } catch (...) {
    std::error_code ec;
    fs::remove_all(o.out, ec);  // made here: check_out saw nothing there
    throw;
  }
  log << "wrote " << t->paths.ckpt_root.string() << "/step-00000000; continue with: moe train --config "
      << o.config_path << " --run-dir " << o.out << "\n";
}

}  // namespace moe
