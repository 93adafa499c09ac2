// Reading a trained model out of a checkpoint: see checkpoint_model.h.
#include "launch/interop/checkpoint_model.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>

#include "checkpoint/stacked.h"
#include "core/error.h"
#include "data/file_io.h"
#include "launch/commands/ckpt_command.h"

namespace moe {

const std::vector<int64_t>& CheckpointModel::shape(const std::string& tensor) const {
  const auto it = tensors.find(tensor);
  if (it == tensors.end())
    MOE_BAD_INPUT("checkpoint " << dir << " holds no tensor " << tensor << " (the model of its config needs it)");
  return it->second.first;
}

CheckpointModel open_checkpoint_model(const std::string& path, std::ostream& log) {
  CheckpointModel m;
  m.dir = checkpoint_of_path(path, log);
  std::string why;
  std::optional<ckpt::Resolved> resolved = ckpt::verify_checkpoint(m.dir, {}, &why);
  if (!resolved) MOE_BAD_INPUT("checkpoint " << m.dir << " does not verify: " << why);
  m.resolved = std::move(*resolved);
  for (ckpt::Manifest& member : m.resolved.chain) ckpt::stack_legacy_parts(member);  // W1, W3 as W13's parts
  const ckpt::Manifest& head = m.resolved.chain.back();
  m.step = head.step;
  m.config = config_from_json(head.config, {}, m.dir + "/" + ckpt::kManifestName + " (its \"config\")");
  for (const ckpt::FileEntry& f : head.files) {
    if (f.peer_copy) continue;
    for (const ckpt::DatasetEntry& d : f.datasets)
      m.tensors.emplace(d.tensor, std::make_pair(d.global_shape(), d.dtype));
  }
  return m;
}

std::vector<float> read_tensor(const CheckpointModel& model, const std::string& tensor) {
  const std::vector<int64_t>& shape = model.shape(tensor);
  const ckpt::DType dtype = model.tensors.at(tensor).second;
  if (dtype != ckpt::DType::F32)
    MOE_BAD_INPUT("checkpoint " << model.dir << ": tensor " << tensor << " is stored as " << ckpt::dtype_name(dtype)
                                << "; expected f32");
  ckpt::Piece piece;
  piece.tensor = tensor, piece.dtype = dtype, piece.slab = ckpt::Slab::whole(shape);
  // Zeros: along a chain of deltas the base's bits are XORed into the buffer.
  std::vector<float> values(size_t(piece.count()), 0.0f);
  piece.dst = values.data();
  ckpt::load_pieces(model.resolved, {piece});
  return values;
}

double router_tau(const CheckpointModel& model, int64_t layer) {
  const RouterConfig& r = model.config.moe.router;
  if (!r.tau_learned)  // the temperature of the checkpoint's last step, which its evaluation used too
    return r.tau_at(std::max<int64_t>(model.step - 1, 0));
  const std::string name = "params/layers." + std::to_string(layer) + ".ffn.tau.log_ratio";
  const std::vector<float> log_ratio = read_tensor(model, name);
  if (log_ratio.size() != 1)
    MOE_BAD_INPUT("checkpoint " << model.dir << ": tensor " << name << " holds " << log_ratio.size()
                                << " values; expected 1");
  return std::clamp(r.tau_at(0) * std::exp(double(log_ratio[0])), r.tau_min, r.tau_max);
}

ModelTokenizer model_tokenizer(const CheckpointModel& model) {
  ModelTokenizer t;
  const nlohmann::json& data = model.resolved.chain.back().data;
  if (!data.is_object() || !data.contains("sources") || !data["sources"].is_array()) return t;
  std::string hash;
  for (const nlohmann::json& source : data["sources"]) {
    if (!source.is_object() || source.value("tokenizer", std::string("byte")) != "bpe") continue;
    const std::string path = source.value("path", std::string()),
                      xxh64 = source.value("tokenizer_xxh64", std::string());
    if (!hash.empty() && xxh64 != hash)
      MOE_BAD_INPUT("checkpoint " << model.dir << ": its data sources were prepared with two BPE tokenizers (" << t.file
                                  << " and " << path << "/tokenizer.bpe); a model has one");
    hash = xxh64, t.kind = "bpe", t.file = path + "/tokenizer.bpe", t.xxh64 = xxh64;
  }
  return t;
}

data::BpeTokenizer load_model_bpe(const ModelTokenizer& tokenizer) {
  const std::string text =
      data::read_regular_file(tokenizer.file, uint64_t(256) << 20, tokenizer.file + " (tokenizer)");
  const std::string now = data::hex64(XXH64(text.data(), text.size(), 0));
  if (now != tokenizer.xxh64)
    MOE_BAD_INPUT(tokenizer.file << " has xxh64 " << now << ", but the model was trained with a tokenizer of xxh64 "
                                 << tokenizer.xxh64 << " there: it is not the model's tokenizer any more");
  return data::BpeTokenizer::parse(text, tokenizer.file);
}

}  // namespace moe
