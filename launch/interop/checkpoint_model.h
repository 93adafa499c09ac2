// A trained model read out of a checkpoint, for the commands that take a model from a run (`moe logits`,
// `moe export hf`): PATH resolved as `moe ckpt` resolves it (a run directory or checkpoint root means its
// newest checkpoint), the checkpoint verified as `moe ckpt verify` and --resume verify it, the run's config
// parsed from its manifest, and parameters read whole, one tensor at a time, by global name and shape, whatever
// layout (tp, pp, ep, ZeRO, deltas) wrote them. Never writes anything. docs/interop.md.
#pragma once

#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "checkpoint/checkpointer.h"
#include "data/bpe.h"
#include "launch/config/config.h"

namespace moe {

struct CheckpointModel {
  std::string dir;  // the checkpoint directory
  ckpt::Resolved resolved;
  Config config;  // the config of the run that wrote it
  int64_t step = 0;
  // Every tensor of the checkpoint by global name ("params/layers.0.attn.wq"): its global shape and dtype.
  std::map<std::string, std::pair<std::vector<int64_t>, ckpt::DType>> tensors;

  bool has(const std::string& tensor) const { return tensors.count(tensor) > 0; }
  // The global shape of `tensor`; BadInput naming the checkpoint when it holds no such tensor.
  const std::vector<int64_t>& shape(const std::string& tensor) const;
};

// Resolves PATH, verifies the checkpoint and reads its manifest; says which checkpoint on `log`. BadInput
// (naming the path and the problem) for a path that is no checkpoint, one that does not verify, or a manifest
// whose config is not a valid config.
CheckpointModel open_checkpoint_model(const std::string& path, std::ostream& log);

// The whole tensor `tensor` (an F32 tensor of the checkpoint), row-major in its global shape.
std::vector<float> read_tensor(const CheckpointModel& model, const std::string& tensor);

// The router temperature the checkpoint's forward uses in layer `layer` (an MoE layer): the learned one
// (moe.router.tau_learned: tau_at(0) * exp(log_ratio), clamped to [tau_min, tau_max]) or the schedule's at the
// checkpoint's step. Reads the learned parameter when there is one.
double router_tau(const CheckpointModel& model, int64_t layer);

// The tokenizer the model was trained with, from the checkpoint's data provenance: "byte" (text sources, ids
// 0..255 the bytes) or "bpe" (a prepared source's byte-level BPE: `file` its tokenizer.bpe). Byte sources beside
// a BPE one are the BPE's byte ids. BadInput when two prepared sources used different BPE tokenizers.
struct ModelTokenizer {
  std::string kind = "byte";
  std::string file;
  std::string xxh64;  // of the file, as the data provenance recorded it
};
ModelTokenizer model_tokenizer(const CheckpointModel& model);
// The BPE of a "bpe" ModelTokenizer; BadInput naming the file when it is missing, not a tokenizer, or no longer
// the file the model was trained with (its xxh64 changed).
data::BpeTokenizer load_model_bpe(const ModelTokenizer& tokenizer);

}  // namespace moe
