// Vocabulary-parallel cross-entropy (parallel/vocab_parallel.h) against the cross-entropy of the whole
// vocabulary computed on one rank, and its backward against finite differences of the summed loss.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "core/backend/backend.h"
#include "parallel/mpi_communicator.h"
#include "parallel/vocab_parallel.h"

namespace moe {
namespace {

constexpr int64_t N = 7, Vl = 5;

// The CPU backend: its memory is the host's, so host vectors are its buffers here.
Backend& cpu() {
  static const std::unique_ptr<Backend> backend = make_cpu_backend(1);
  return *backend;
}

// The whole (N, V) logits, the same on every rank; targets cover every block.
std::vector<float> full_logits(int64_t V) {
  std::vector<float> z(static_cast<size_t>(N * V));
  for (int64_t i = 0; i < N * V; ++i) z[size_t(i)] = float(std::sin(0.7 * double(i)) * 3.0);
  return z;
}
std::vector<int32_t> targets(int64_t V) {
  std::vector<int32_t> t(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) t[size_t(n)] = int32_t((n * 11 + 3) % V);
  return t;
}
std::vector<float> block(const std::vector<float>& z, int64_t V, int rank) {
  std::vector<float> b(static_cast<size_t>(N * Vl));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = 0; v < Vl; ++v) b[size_t(n * Vl + v)] = z[size_t(n * V + rank * Vl + v)];
  return b;
}
// Serial reference in double: -log softmax(z)[t] per row.
std::vector<double> serial_losses(const std::vector<float>& z, const std::vector<int32_t>& t, int64_t V) {
  std::vector<double> out(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    double m = -1e300, s = 0;
    for (int64_t v = 0; v < V; ++v) m = std::max(m, double(z[size_t(n * V + v)]));
    for (int64_t v = 0; v < V; ++v) s += std::exp(double(z[size_t(n * V + v)]) - m);
    out[size_t(n)] = m + std::log(s) - double(z[size_t(n * V + t[size_t(n)])]);
  }
  return out;
}

TEST(VocabParallel, LossesEqualTheWholeVocabularysOnEveryRank) {
  const auto tp = MpiCommunicator::world();
  const int64_t V = Vl * tp->size();
  const std::vector<float> z = full_logits(V);
  const std::vector<int32_t> t = targets(V);
  const std::vector<float> mine = block(z, V, tp->rank());
  std::vector<float> losses(static_cast<size_t>(N));
  std::vector<float> lse(static_cast<size_t>(N));
  tp::vocab_parallel_cross_entropy_forward(cpu(), *tp, mine.data(), t.data(), losses.data(), lse.data(), N, Vl);
  const std::vector<double> expected = serial_losses(z, t, V);
  for (int64_t n = 0; n < N; ++n) EXPECT_NEAR(losses[size_t(n)], expected[size_t(n)], 1e-6 * (1 + expected[size_t(n)]));
  // Backward: this rank's block of the whole vocabulary's gradient (softmax - onehot) * scale.
  const float scale = 0.25f;
  std::vector<float> d(static_cast<size_t>(N * Vl));
  tp::vocab_parallel_cross_entropy_backward(cpu(), *tp, mine.data(), t.data(), lse.data(), scale, d.data(), N, Vl);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = 0; v < Vl; ++v) {
      const int64_t g = tp->rank() * Vl + v;
      // log-sum-exp = loss + the target's logit
      const double lse_n = expected[size_t(n)] + double(z[size_t(n * V + t[size_t(n)])]);
      const double p = std::exp(double(z[size_t(n * V + g)]) - lse_n);
      const double want = (p - (g == t[size_t(n)] ? 1.0 : 0.0)) * scale;
      EXPECT_NEAR(d[size_t(n * Vl + v)], want, 1e-6 * (1 + lse_n));
    }
}

// d(scale * sum of losses)/d(logit) against central differences of the distributed forward (every rank
// perturbs the same global logit; only its owner's block changes).
TEST(VocabParallel, BackwardMatchesFiniteDifferences) {
  const auto tp = MpiCommunicator::world();
  const int64_t V = Vl * tp->size();
  const std::vector<float> z = full_logits(V);
  const std::vector<int32_t> t = targets(V);
  const float scale = 1.0f;
  auto total = [&](const std::vector<float>& whole) {
    const std::vector<float> mine = block(whole, V, tp->rank());
    std::vector<float> losses(static_cast<size_t>(N));
    std::vector<float> lse(static_cast<size_t>(N));
    tp::vocab_parallel_cross_entropy_forward(cpu(), *tp, mine.data(), t.data(), losses.data(), lse.data(), N, Vl);
    double s = 0;
    for (float l : losses) s += double(l);
    return s;
  };
  const std::vector<float> mine = block(z, V, tp->rank());
  std::vector<float> losses(static_cast<size_t>(N));
  std::vector<float> lse(static_cast<size_t>(N));
  tp::vocab_parallel_cross_entropy_forward(cpu(), *tp, mine.data(), t.data(), losses.data(), lse.data(), N, Vl);
  std::vector<float> d(static_cast<size_t>(N * Vl));
  tp::vocab_parallel_cross_entropy_backward(cpu(), *tp, mine.data(), t.data(), lse.data(), scale, d.data(), N, Vl);
  std::vector<float> grad(static_cast<size_t>(N * V), 0.0f);  // the whole gradient, gathered by sums
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = 0; v < Vl; ++v) grad[size_t(n * V + tp->rank() * Vl + v)] = d[size_t(n * Vl + v)];
  tp->allreduce_sum(grad.data(), N * V);
  const float eps = 1e-2f;
  for (int64_t i = 0; i < N * V; i += 3) {
    std::vector<float> plus = z, minus = z;
    plus[size_t(i)] += eps, minus[size_t(i)] -= eps;
    const double fd = (total(plus) - total(minus)) / (2.0 * double(eps));
    EXPECT_NEAR(grad[size_t(i)], fd, 2e-3) << "logit " << i;
  }
}

}  // namespace
}  // namespace moe
