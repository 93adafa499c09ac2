// The config's choice-valued keys as enums. Each enum's names are spelt once, in a table here: the schema's allowed
// values (launch/config/config_schema.cpp, docs/config.md) are its names in its order, the config is filled from
// them once (launch/config/config_fill.cpp), and every value printed (messages, notes, files) is to_string's. The
// enums a core component already has (the router's, the dispatcher's, recompute, GEMM precision) are the config's
// own; the ones only the launcher reads are declared here.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/backend/fused_attention.h"
#include "core/backend/ops.h"
#include "core/moe/settings.h"
#include "core/recompute.h"

namespace moe {

// train.device: where the model computes.
enum class Device : uint8_t { Cpu, Cuda };
// model.attention: multi-head rotary attention, or multi-head latent attention (core/mla_attention.h).
enum class AttentionKind : uint8_t { Mha, Mla };
// parallel.pp_schedule: how the stages order their micro-batches (parallel/pp_schedule.h).
enum class PpSchedule : uint8_t { OneFOneB, Interleaved1F1B };
// fault.inject[].kind: the fault a rank injects into itself (launch/train/faults.h, docs/fault.md).
enum class FaultKind : uint8_t {
  Kill,
  Hang,
  Stop,
  Exception,
  CorruptCheckpoint,
  FreezeAlltoall,
  MismatchAlltoall,
};

// The names of enum E's values, in the order docs/config.md lists them; specialised for each choice enum.
template <typename E>
struct ChoiceNames;

template <typename E, size_t N>
using NameTable = std::array<std::pair<E, std::string_view>, N>;

template <>
struct ChoiceNames<Device> {
  static constexpr NameTable<Device, 2> names{{{Device::Cpu, "cpu"}, {Device::Cuda, "cuda"}}};
};
template <>
struct ChoiceNames<GemmPrecision> {
  static constexpr NameTable<GemmPrecision, 2> names{{{GemmPrecision::Fp32, "fp32"}, {GemmPrecision::Bf16, "bf16"}}};
};
template <>
struct ChoiceNames<Recompute> {
  static constexpr NameTable<Recompute, 3> names{
      {{Recompute::None, "none"}, {Recompute::Selective, "selective"}, {Recompute::Full, "full"}}};
};
template <>
struct ChoiceNames<FusedAttention> {
  static constexpr NameTable<FusedAttention, 3> names{{{FusedAttention::Deterministic, "deterministic"},
                                                       {FusedAttention::Nondeterministic, "nondeterministic"},
                                                       {FusedAttention::Off, "off"}}};
};
template <>
struct ChoiceNames<AttentionKind> {
  static constexpr NameTable<AttentionKind, 2> names{{{AttentionKind::Mha, "mha"}, {AttentionKind::Mla, "mla"}}};
};
template <>
struct ChoiceNames<RouterNoise> {
  static constexpr NameTable<RouterNoise, 2> names{{{RouterNoise::Gumbel, "gumbel"}, {RouterNoise::None, "none"}}};
};
template <>
struct ChoiceNames<RouterScore> {
  static constexpr NameTable<RouterScore, 2> names{
      {{RouterScore::Softmax, "softmax"}, {RouterScore::Sigmoid, "sigmoid"}}};
};
template <>
struct ChoiceNames<BiasRule> {
  static constexpr NameTable<BiasRule, 2> names{{{BiasRule::Sign, "sign"}, {BiasRule::Proportional, "proportional"}}};
};
template <>
struct ChoiceNames<DropPolicy> {
  static constexpr NameTable<DropPolicy, 2> names{{{DropPolicy::Probs, "probs"}, {DropPolicy::Position, "position"}}};
};
template <>
struct ChoiceNames<DispatcherKind> {
  static constexpr NameTable<DispatcherKind, 2> names{
      {{DispatcherKind::AllToAll, "alltoall"}, {DispatcherKind::AllGather, "allgather"}}};
};
// moe.overflow's levels; Overflow::RerouteDense is the cascade ["reroute", "dense"], not a level of its own.
template <>
struct ChoiceNames<Overflow> {
  static constexpr NameTable<Overflow, 3> names{
      {{Overflow::Drop, "drop"}, {Overflow::Reroute, "reroute"}, {Overflow::Dense, "dense"}}};
};
template <>
struct ChoiceNames<PpSchedule> {
  static constexpr NameTable<PpSchedule, 2> names{
      {{PpSchedule::OneFOneB, "1f1b"}, {PpSchedule::Interleaved1F1B, "interleaved_1f1b"}}};
};
template <>
struct ChoiceNames<FaultKind> {
  static constexpr NameTable<FaultKind, 7> names{{{FaultKind::Kill, "kill"},
                                                  {FaultKind::Hang, "hang"},
                                                  {FaultKind::Stop, "stop"},
                                                  {FaultKind::Exception, "exception"},
                                                  {FaultKind::CorruptCheckpoint, "corrupt_checkpoint"},
                                                  {FaultKind::FreezeAlltoall, "freeze_alltoall"},
                                                  {FaultKind::MismatchAlltoall, "mismatch_alltoall"}}};
};

template <typename E>
concept ConfigChoice = requires {
  ChoiceNames<E>::names;
};

// Internal errors: what reaches these was checked against the same table (the schema), or is a value the program
// set itself.
[[noreturn]] void unnamed_choice(int value);
[[noreturn]] void unknown_choice(std::string_view name);

// The name a config file spells `value` with.
template <ConfigChoice E>
std::string to_string(E value) {
  for (const auto& [v, name] : ChoiceNames<E>::names)
    if (v == value) return std::string(name);
  unnamed_choice(int(value));
}

// The value `name` spells (a name the schema accepted for this key).
template <ConfigChoice E>
E choice_from_string(std::string_view name) {
  for (const auto& [v, n] : ChoiceNames<E>::names)
    if (n == name) return v;
  unknown_choice(name);
}

// Every name of E, in its table's order: the schema's allowed values.
template <ConfigChoice E>
std::vector<std::string> choice_names() {
  std::vector<std::string> out;
  for (const auto& entry : ChoiceNames<E>::names) out.emplace_back(entry.second);
  return out;
}

}  // namespace moe
