// Tests of the memory estimate (launch/config/memory.h): at tp = 1 its parameters, gradients, optimizer state,
// activations and scratch are exactly the bytes the trainer allocates through the backend (dense and MoE
// models, recompute on and off, ZeRO on and off), and the MoE layers' routed rows are within 10% of what one
// forward and backward allocate; the tensor-parallel layout of docs/parallel.md "Memory per rank"; and the
// refusal of an impossible size by name. Not here: the manifest's copy (test_trainer.cpp), the program's
// exit code (tests/cli/test_bad_input.sh), the backend's counting itself (tests/core/test_model.cpp).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "core/backend/backend.h"
#include "core/error.h"
#include "launch/config/memory.h"
#include "memory_harness.h"
#include "parallel/self_communicator.h"

namespace moe {
namespace {

using json = nlohmann::json;
using namespace test_support;

// bf16 GEMMs too: the attention's input, the MLP's tensors and the head's logit gradient held rounded.
TEST(MemoryEstimate, DenseModelIsExactlyWhatTheTrainerAllocates) {
  for (const char* recompute : {"none", "full"})
    for (const char* zero : {"false", "true"})
      for (const char* precision : {"fp32", "bf16"}) {
        const Config config =
            small_config({std::string("train.recompute=") + recompute, std::string("optim.zero=") + zero,
                          std::string("train.precision=") + precision});
        SCOPED_TRACE(std::string("recompute ") + recompute + ", zero " + zero + ", " + precision);
        const MemoryEstimate e = estimate_memory(config, 1, 1, 1);
        const Measured m = measure(config, std::make_unique<SelfCommunicator>("world"));
        EXPECT_EQ(e.parameters, 4 * m.parameters);
        EXPECT_EQ(e.gradients, 4 * m.parameters);
        EXPECT_EQ(e.optimizer, 8 * m.parameters);  // two fp32 moments; ZeRO over one rank keeps them all
        EXPECT_EQ(allocated_at_construction(e), m.constructed);
        EXPECT_EQ(m.peak, m.constructed) << "a dense model allocates nothing in forward or backward";
        EXPECT_EQ(e.routed_rows, 0);
        EXPECT_EQ(e.communication, 0);
      }
}

// train.device = cuda with bf16 GEMMs counts cuDNN's fused attention: each row's log-sum-exp kept instead of the
// probabilities, no (T, T) scratch. Measured on the CPU backend with its fused form turned on, which MhaAttention
// uses the same way.
TEST(MemoryEstimate, FusedAttentionIsExactlyWhatTheTrainerAllocates) {
  for (const char* recompute : {"none", "selective"}) {
    const std::vector<std::string> set = {"train.precision=bf16", std::string("train.recompute=") + recompute};
    Config config = small_config(set);
    const MemoryEstimate plain = estimate_memory(config, 1, 1, 1);
    config.train.device = Device::Cuda;
    SCOPED_TRACE(std::string("recompute ") + recompute);
    const MemoryEstimate e = estimate_memory(config, 1, 1, 1);
    const Measured m = measure(config, std::make_unique<SelfCommunicator>("world"), true);
    EXPECT_EQ(allocated_at_construction(e), m.constructed);
    EXPECT_EQ(m.peak, m.constructed);
    EXPECT_LT(e.activations + e.scratch, plain.activations + plain.scratch);
  }
}

// The CUDA backend's own device memory (train.device = cuda), each by core/sizes.h's terms, which the backend
// allocates by: what it keeps (cuBLAS's 32 MiB workspace, the rotary table (T, Dh / 2) of cos and sin, with bf16
// GEMMs the parameters' bf16 copy) and its largest transient workspace of one call: the fused attention backward's bf16
// sections (dO, dq, dk, dv: the layer holds q, k, v and O where cuDNN reads them), statistics and row sums and dS (B,
// H, T, T) bf16 (deterministic) or dQ in fp32, or the plain attention's fp32 output before it is rounded (fused
// attention off); none on the CPU.
TEST(MemoryEstimate, DeviceWorkspaceIsWhatTheCudaBackendKeepsAndItsLargestCall) {
  Config config = small_config({"train.precision=bf16"});
  EXPECT_EQ(estimate_memory(config, 1, 1, 1).device_workspace, 0) << "the CPU backend takes no workspace";
  config.train.device = Device::Cuda;
  const double N = double(config.train.micro_batch * config.train.seq_len), D = double(config.model.d_model),
               H = double(config.model.heads), T = double(config.train.seq_len);
  const double parameters = double(estimate_memory(config, 1, 1, 1).parameters) / 4;
  const double kept = 32 * 1024 * 1024 + 2 * T * (D / H / 2) * 4, parameter_copy = 2 * parameters;
  // The head's GEMMs read its input and its logits' gradient held rounded: no rounding workspace of theirs.
  const double attention = 2 * 4 * N * D + 2 * 4 * N * H, plain_output = 4 * N * D;
  const double deterministic = attention + 2 * N * H * T, atomic = attention + 4 * N * D;
  const MemoryEstimate e = estimate_memory(config, 1, 1, 1);
  EXPECT_EQ(e.device_workspace, int64_t(kept + parameter_copy + deterministic));
  EXPECT_EQ(e.total(), e.parameters + e.gradients + e.optimizer + e.activations + e.scratch + e.routed_rows +
                           e.communication + e.device_workspace);
  config.train.fused_attention = FusedAttention::Nondeterministic;
  EXPECT_EQ(estimate_memory(config, 1, 1, 1).device_workspace, int64_t(kept + parameter_copy + atomic));
  config.train.fused_attention = FusedAttention::Off;
  EXPECT_EQ(estimate_memory(config, 1, 1, 1).device_workspace, int64_t(kept + parameter_copy + plain_output));
  config.train.precision = GemmPrecision::Fp32;
  EXPECT_EQ(estimate_memory(config, 1, 1, 1).device_workspace, int64_t(kept)) << "no copies in fp32";
}

// What the trainer's check holds against a rank's memory: the estimate's total and, with bf16 GEMMs on the CPU only,
// the parameters rounded and kept in fp32 beside them. On a GPU their bf16 copy is in device_workspace already and is
// not counted twice (at bench_mixtral's size that would be 12 GB more than the run needs).
TEST(MemoryCheck, CountsTheRoundedParametersOnce) {
  Config config = small_config({"train.precision=bf16"});
  const MemoryEstimate cpu = estimate_memory(config, 1, 1, 1);
  EXPECT_EQ(host_rounded_parameter_bytes(config, cpu), double(cpu.parameters));
  config.train.precision = GemmPrecision::Fp32;
  EXPECT_EQ(host_rounded_parameter_bytes(config, cpu), 0.0);
  config.train.device = Device::Cuda;
  EXPECT_EQ(host_rounded_parameter_bytes(config, estimate_memory(config, 1, 1, 1)), 0.0);
  config.train.precision = GemmPrecision::Bf16;
  const MemoryEstimate gpu = estimate_memory(config, 1, 1, 1);
  EXPECT_EQ(host_rounded_parameter_bytes(config, gpu), 0.0);
  config.train.precision = GemmPrecision::Fp32;
  EXPECT_GE(gpu.device_workspace - estimate_memory(config, 1, 1, 1).device_workspace, gpu.parameters / 2)
      << "the bf16 copy (parameters / 2 bytes) is in the device workspace";
}

// An MoE layer's grouped GEMM on the CUDA backend: its largest operand not held rounded, da (R, Fe), in bf16 (xe and
// h are held rounded) and the grouped call's pointers (3 per local expert) when larger than the plain attention's fp32
// output (fused attention off); dropless
// R = N K.
TEST(MemoryEstimate, DeviceWorkspaceOfTheExpertsGroupedGemm) {
  Config config = small_config({"train.precision=bf16", "moe.num_experts=8", "moe.top_k=4", "moe.capacity_factor=0",
                                "moe.expert_hidden=512", "train.fused_attention=off"});
  config.train.device = Device::Cuda;
  const double N = double(config.train.micro_batch * config.train.seq_len), D = 64, T = 32, Dh = 16;
  const double kept = 32 * 1024 * 1024 + 2 * T * (Dh / 2) * 4;
  for (const int64_t ep : {1, 2}) {
    const MemoryEstimate e = estimate_memory(config, 1, 2, ep);
    const double R = N * 4, experts = 2 * R * 512 + 3 * (8.0 / double(ep)) * sizeof(void*);
    ASSERT_GT(experts, 4 * N * D) << "the plain attention's fp32 output is smaller";
    EXPECT_EQ(e.device_workspace, int64_t(kept + 2 * double(e.parameters) / 4 + experts)) << "ep " << ep;
  }
}

// A rank's interleaved chunks share one parameter table and one backend: the backend keeps one workspace, one
// rotary table and one bf16 copy of the whole table, beside the largest call of any chunk.
TEST(MemoryEstimate, InterleavedChunksShareTheBackendsOwnMemory) {
  Config config = small_config({"train.precision=bf16", "model.layers=4", "parallel.pp=2", "parallel.vpp=2",
                                "parallel.pp_schedule=interleaved_1f1b"});
  config.train.device = Device::Cuda;
  const StageEstimate largest = largest_stage_estimate(config, 1, 1, 1);
  const std::vector<StagePart> parts = pipeline_chunk_parts(config, largest.stage, 2);
  ASSERT_EQ(parts.size(), 2u);
  const MemoryEstimate a = estimate_memory(config, 1, 1, 1, parts[0]), b = estimate_memory(config, 1, 1, 1, parts[1]);
  const int64_t kept = 32 * 1024 * 1024 + 2 * 32 * 8 * 4;
  const int64_t own_a = kept + a.parameters / 2, own_b = kept + b.parameters / 2;  // bf16: half an fp32 parameter
  EXPECT_EQ(largest.memory.parameters, a.parameters + b.parameters);
  EXPECT_EQ(largest.memory.device_workspace, kept + (a.parameters + b.parameters) / 2 +
                                                 std::max(a.device_workspace - own_a, b.device_workspace - own_b));
}

TEST(MemoryEstimate, MoeModelExactAtConstructionRoutedRowsWithinTenPercent) {
  const std::vector<std::vector<std::string>> cases = {
      {"moe.num_experts=4"},                                                   // every layer MoE, capacity 1.25, drops
      {"moe.num_experts=4", "moe.capacity_factor=0.5", "moe.overflow=dense"},  // half overflows to the fallback
      {"moe.num_experts=8", "moe.every=2", "moe.shared_experts=1", "moe.overflow=dense", "moe.router.noise=gumbel"},
      {"moe.num_experts=4", "moe.capacity_factor=0", "train.recompute=full"},  // dropless
      {"moe.num_experts=8", "moe.top_k=3", "moe.overflow=reroute", "moe.capacity_factor=1.0"},
      {"moe.num_experts=4", "moe.router.tau_learned=true"},  // the temperature's log-ratio, one parameter a layer
      {"moe.num_experts=4", "moe.capacity_factor=0.5", "moe.overflow=dense", "train.precision=bf16"},  // held fallback
  };
  for (const std::vector<std::string>& extra : cases) {
    const Config config = small_config(extra);
    SCOPED_TRACE(config.resolved.at("moe").dump());
    const MemoryEstimate e = estimate_memory(config, 1, 1, 1);
    const Measured m = measure(config, std::make_unique<SelfCommunicator>("world"));
    EXPECT_EQ(e.parameters, 4 * m.parameters);
    EXPECT_EQ(e.gradients, 4 * m.parameters);
    EXPECT_EQ(allocated_at_construction(e), m.constructed);
    // The routed rows depend on the routing, which the estimate takes as balanced.
    const int64_t routed = m.peak - m.constructed;
    ASSERT_GT(routed, 0);
    EXPECT_LE(std::abs(double(e.routed_rows - routed)), 0.1 * double(routed))
        << "estimated " << e.routed_rows << " bytes of routed rows, allocated " << routed;
    EXPECT_EQ(e.communication, 0) << "over one rank the rows are copied, not staged";
  }
}

// Dropless over one rank every assignment is kept and computed here (M = R = N K), so the routed rows do not
// depend on the routing: the router's buffers, the dispatch plan's (planned on the backend), the experts'
// activations and the layer's workspaces are exactly what one forward and backward allocate, and nothing is staged.
TEST(MemoryEstimate, DroplessRoutedRowsAreExactlyWhatOneForwardAndBackwardAllocate) {
  const std::vector<std::vector<std::string>> cases = {
      {"moe.num_experts=4"},
      {"moe.num_experts=4", "moe.router.noise=gumbel", "train.recompute=full"},
      {"moe.num_experts=8", "moe.top_k=3", "moe.every=2", "moe.shared_experts=1", "train.recompute=selective"},
      {"moe.num_experts=4", "moe.top_k=1", "moe.router.tau_learned=true", "moe.router.noise=gumbel"},
      {"moe.num_experts=4", "train.precision=bf16"},  // the experts' activations held rounded
      {"moe.num_experts=8", "moe.top_k=3", "moe.every=2", "moe.shared_experts=1", "train.precision=bf16"},
  };
  for (std::vector<std::string> extra : cases) {
    extra.push_back("moe.capacity_factor=0");
    const Config config = small_config(extra);
    SCOPED_TRACE(config.resolved.at("moe").dump());
    const MemoryEstimate e = estimate_memory(config, 1, 1, 1);
    const Measured m = measure(config, std::make_unique<SelfCommunicator>("world"));
    EXPECT_EQ(allocated_at_construction(e), m.constructed);
    EXPECT_EQ(e.routed_rows, m.peak - m.constructed);
    EXPECT_EQ(e.communication, 0);
  }
}

// Per-rank elements of docs/parallel.md's layout, tensor by tensor: D 64, V 256, F 96, H 4, 2 layers (the
// second MoE: moe.every = 2), 8 experts of width 48, one shared expert, a fallback of width 16.
TEST(MemoryEstimate, TensorParallelSplitsTheTensorsOfTheLayout) {
  Config config = small_config(
      {"moe.num_experts=8", "moe.every=2", "moe.shared_experts=1", "moe.overflow=dense", "moe.fallback_hidden=16"});
  const int64_t D = 64, V = 256, F = 96, E = 8, Fe = 48, Ff = 16;
  for (int64_t tp : {1, 2, 4})
    for (int64_t ep : {1, 2})
      for (bool expert_tp : {false, true}) {
        config.parallel.expert_tp = expert_tp ? tp : 1;
        SCOPED_TRACE("tp " + std::to_string(tp) + ", ep " + std::to_string(ep) + ", expert_tp " +
                     std::to_string(config.parallel.expert_tp));
        const int64_t norms = 2 * 2 * D + D;                           // two per layer, the output norm
        const int64_t embedding_and_head = V / tp * D + D * (V / tp);  // rows and columns split
        const int64_t attention = 2 * 4 * D * (D / tp);                // Wq, Wk, Wv, Wo in both layers
        const int64_t dense_mlp = 3 * D * (F / tp);                    // layer 0
        // Layer 1: the router whole; the shared expert and the fallback whole, or split with the experts.
        const int64_t router_shared_fallback = D * E + (3 * D * Fe + 3 * D * Ff) / config.parallel.expert_tp;
        const int64_t experts = 3 * (E / ep) * D * (Fe / config.parallel.expert_tp);
        const int64_t elements = norms + embedding_and_head + attention + dense_mlp + router_shared_fallback + experts;
        const MemoryEstimate e = estimate_memory(config, tp, 2, ep);
        EXPECT_EQ(e.parameters, 4 * elements);
        EXPECT_EQ(e.gradients, 4 * elements);
      }
}

// The all-gather dispatcher stages every rank's block of rows and its own, ep + 1 times the all-to-all's
// received rows (as many as a rank sends, in the estimate); over one rank neither stages (the rows are copied).
TEST(MemoryEstimate, TheAllGatherDispatcherStagesEveryRanksRows) {
  Config config = small_config({"moe.num_experts=8"});
  for (const int64_t ep : {1, 2, 4}) {
    config.moe.dispatcher = DispatcherKind::AllToAll;
    const MemoryEstimate alltoall = estimate_memory(config, 1, 4, ep);
    config.moe.dispatcher = DispatcherKind::AllGather;
    const MemoryEstimate allgather = estimate_memory(config, 1, 4, ep);
    if (ep == 1) {
      EXPECT_EQ(alltoall.communication, 0);
      EXPECT_EQ(allgather.communication, 0);
      continue;
    }
    ASSERT_GT(alltoall.communication, 0) << "no ZeRO: the MoE staging alone";
    EXPECT_NEAR(double(allgather.communication), double(ep + 1) * double(alltoall.communication), ep) << "ep " << ep;
    EXPECT_EQ(allgather.total() - alltoall.total(), allgather.communication - alltoall.communication);
  }
}

TEST(MemoryEstimate, ZeroShardsTheMomentsOverTheirGroups) {
  Config config = small_config({"moe.num_experts=8"});
  const MemoryEstimate plain = estimate_memory(config, 1, 4, 2);
  EXPECT_EQ(plain.optimizer, 2 * plain.parameters);
  EXPECT_EQ(plain.communication, estimate_memory(config, 1, 1, 2).communication) << "all-reduce is in place";
  config.optim.zero = true;
  const MemoryEstimate zero = estimate_memory(config, 1, 4, 2);
  // Experts of both layers (4 of 8 here, each 3 D Fe) over edp = 4 / 2 ranks, the rest over dp = 4.
  const int64_t expert = 2 * 3 * 4 * 64 * 48, dense = plain.parameters / 4 - expert;
  EXPECT_EQ(zero.optimizer, 2 * 4 * (dense / 4 + expert / 2));
  // The reduce-scatter stages every gradient bucket on the host and receives this rank's slice.
  EXPECT_EQ(zero.communication - plain.communication, 4 * (dense + dense / 4 + expert + expert / 2));
  EXPECT_EQ(estimate_memory(config, 1, 1, 1).optimizer, 2 * estimate_memory(config, 1, 1, 1).parameters)
      << "ZeRO over one rank keeps everything";
}

// docs/parallel.md: with sequence parallelism the residual stream and the norms hold N / tp rows; attention
// keeps q, k, v, att at (N, D/tp) and the probabilities at (B, H/tp, T, T); the dense MLP 3 N F/tp; the head
// its block of logits (N, V/tp) and their log-sum-exp (N). The tp layers gather their input again in
// backward rather than keep it, so sequence parallelism saves the residual stream's memory.
TEST(MemoryEstimate, SequenceParallelSplitsTheResidualStream) {
  Config config = small_config();
  const double N = 4 * 32, D = 64, T = 32, H = 4, F = 96, V = 256, L = 2, tp = 2;
  auto expected_activations = [&](double rows) {
    const double layer = 3 * rows * D + 2 * rows + 4 * N * D / tp + N * (H / tp) * T + 3 * N * F / tp;
    const double arena = (L + 1) * rows * D + L * layer + rows * D + rows + N * V / tp + N;
    // With the per-token losses and the token ids, and the step's 2 micro-batches' losses staged for one read.
    return int64_t(4 * (arena + N) + 4 * 2 * N + 4 * 2 * N);
  };
  EXPECT_EQ(estimate_memory(config, 2, 1, 1).activations, expected_activations(N / tp));
  config.parallel.sequence_parallel = false;
  EXPECT_EQ(estimate_memory(config, 2, 1, 1).activations, expected_activations(N));
  EXPECT_LT(expected_activations(N / tp), expected_activations(N));
}

TEST(MemoryEstimate, AbsurdSizesSaturateInsteadOfOverflowing) {
  Config config = small_config();
  config.model.d_model = int64_t(1) << 40;
  config.model.vocab = 2147483647;
  const MemoryEstimate e = estimate_memory(config, 1, 1, 1);
  EXPECT_EQ(e.parameters, INT64_MAX);
  EXPECT_EQ(e.total(), INT64_MAX);
}

TEST(MemoryEstimate, TextAndJson) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(3.25 * 1024 * 1024 * 1024), "3.2 GiB");
  MemoryEstimate e;
  e.parameters = e.gradients = 2048, e.optimizer = 4096, e.activations = 1024 * 1024;
  EXPECT_EQ(memory_text(e),
            "2.0 KiB parameters, 2.0 KiB gradients, 4.0 KiB optimizer state, 1.0 MiB activations; 1.0 MiB in all");
  const json j = memory_json(e);
  EXPECT_EQ(j.at("total").get<int64_t>(), 2048 + 2048 + 4096 + 1024 * 1024);
  EXPECT_EQ(j.at("routed_rows").get<int64_t>(), 0);
  EXPECT_EQ(j.at("device_workspace").get<int64_t>(), 0);
  EXPECT_EQ(j.size(), 10u);
  e.kv_cache_per_token = 2048;
  EXPECT_EQ(memory_text(e),
            "2.0 KiB parameters, 2.0 KiB gradients, 4.0 KiB optimizer state, 1.0 MiB activations; "
            "1.0 MiB in all (a key/value cache would hold 2.0 KiB per token)");
}

// Latent attention (model.attention = mla) in a dense and an MoE model, keeping and recomputing its
// probabilities, with and without the latents' norms and the query latent, in fp32 and with bf16 GEMMs (q, k, v and
// the output held rounded): exactly what the trainer allocates; and the key/value bytes per token, C + R against 2 D.
TEST(MemoryEstimate, LatentAttentionIsExactlyWhatTheTrainerAllocates) {
  for (const char* recompute : {"none", "selective"})
    for (const char* experts : {"0", "4"})
      for (const char* norms : {"false", "true"})
        for (const char* q_rank : {"24", "0"})  // 0: the queries projected from x, no query latent
          for (const char* precision : {"fp32", "bf16"}) {
            const Config config =
                small_config({"model.attention=mla", "model.mla.kv_rank=16", std::string("model.mla.q_rank=") + q_rank,
                              "model.mla.rope_dim=8", std::string("train.recompute=") + recompute,
                              std::string("moe.num_experts=") + experts, std::string("model.mla.norms=") + norms,
                              std::string("train.precision=") + precision});
            SCOPED_TRACE(std::string("recompute ") + recompute + ", experts " + experts + ", norms " + norms +
                         ", q_rank " + q_rank + ", " + precision);
            const MemoryEstimate e = estimate_memory(config, 1, 1, 1);
            const Measured m = measure(config, std::make_unique<SelfCommunicator>("world"));
            EXPECT_EQ(e.parameters, 4 * m.parameters);
            EXPECT_EQ(allocated_at_construction(e), m.constructed);
            EXPECT_EQ(e.kv_cache_per_token, 4 * 2 * (16 + 8));  // 2 layers, fp32
          }
  EXPECT_EQ(estimate_memory(small_config(), 1, 1, 1).kv_cache_per_token, 4 * 2 * 2 * 64);
}

// Grouped-query attention: Wk, Wv of Hkv Dh columns, the key and value heads' gradients in the scratch, k and v
// in a key/value cache of Hkv heads; plain and fused (selective recompute: the probabilities rebuilt in the scratch).
TEST(MemoryEstimate, GroupedQueryAttentionIsExactlyWhatTheTrainerAllocates) {
  const int64_t D = 64, Dh = 16, layers = 2;
  for (const char* kv_heads : {"1", "2"})
    for (const char* recompute : {"none", "selective"})
      for (bool fused : {false, true}) {
        Config config = small_config({std::string("model.kv_heads=") + kv_heads,
                                      std::string("train.recompute=") + recompute, "train.precision=bf16"});
        if (fused) config.train.device = Device::Cuda;
        SCOPED_TRACE(std::string("kv_heads ") + kv_heads + ", recompute " + recompute + (fused ? ", fused" : ""));
        const MemoryEstimate e = estimate_memory(config, 1, 1, 1);
        const Measured m = measure(config, std::make_unique<SelfCommunicator>("world"), fused);
        EXPECT_EQ(e.parameters, 4 * m.parameters);
        EXPECT_EQ(allocated_at_construction(e), m.constructed);
        EXPECT_EQ(m.peak, m.constructed);
        const int64_t Hkv = std::stoll(kv_heads);
        EXPECT_EQ(e.kv_cache_per_token, 4 * layers * 2 * Hkv * Dh);
        const Config mha = small_config();
        EXPECT_EQ(estimate_memory(mha, 1, 1, 1).parameters - e.parameters, 4 * layers * 2 * D * (D - Hkv * Dh));
      }
}

// The trainer's check: a model no machine holds is refused by name, before anything is allocated.
TEST(MemoryCheck, RefusesAnImpossibleSizeByName) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("moe_test_memory_" + std::to_string(::getpid()) + ".json");
  std::ofstream(path) << "{}";
  TrainOptions options;
  options.config_path = path.string();
  options.overrides = {"model.d_model=65536", "model.layers=64"};
  try {
    load_checked_config(options, 1);
    ADD_FAILURE() << "a model of 64 layers of width 65536 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::BadInput) << e.message();
    for (const char* part :
         {"per rank", "parameters", "model.d_model=65536", "model.layers=64", "more than this machine"})
      EXPECT_NE(e.message().find(part), std::string::npos) << part << " not in: " << e.message();
  }
  options.overrides = {"model.d_model=64", "model.layers=2"};
  EXPECT_NO_THROW(load_checked_config(options, 1));
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace moe
