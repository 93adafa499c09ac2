// The rank grid (rank_grid.h): validates the parallel sizes against the world size and maps ranks to
// coordinates and groups. Pure arithmetic; it knows nothing of MPI or communicators.
#include "parallel/rank_grid.h"

#include <array>
#include <climits>
#include <string>

#include "core/error.h"

namespace moe {

const char* group_kind_name(GroupKind kind) {
  switch (kind) {
    case GroupKind::Tp:
      return "tp";
    case GroupKind::Dp:
      return "dp";
    case GroupKind::Pp:
      return "pp";
    case GroupKind::Etp:
      return "etp";
    case GroupKind::Ep:
      return "ep";
    case GroupKind::Edp:
      return "edp";
    case GroupKind::TpDp:
      return "stage";
    case GroupKind::Mp:
      return "mp";
  }
  return "?";
}

namespace {

// Sizes are bounded by INT_MAX (the world size is an MPI int), so a product of three fits in 128 bits.
__extension__ typedef __int128 Wide;

std::string wide_string(Wide value) {  // value >= 0
  std::string digits;
  do {
    digits.insert(digits.begin(), static_cast<char>('0' + static_cast<int>(value % 10)));
    value /= 10;
  } while (value != 0);
  return digits;
}

// "1, 2, 4" for the divisors of n that also divide `also` (0: no second condition).
std::string divisors_string(int64_t n, int64_t also = 0) {
  std::string small, large;
  auto add = [&](std::string& into, int64_t d, bool at_end) {
    if (also != 0 && also % d != 0) return;
    const std::string text = std::to_string(d);
    if (at_end) {
      into += (into.empty() ? "" : ", ") + text;
    } else {
      into = text + (into.empty() ? "" : ", ") + into;
    }
  };
  for (int64_t d = 1; d * d <= n; ++d) {
    if (n % d != 0) continue;
    add(small, d, true);
    if (d != n / d) add(large, n / d, false);
  }
  if (small.empty()) return large;
  return large.empty() ? small : small + ", " + large;
}

// One mixed-radix decomposition of a rank, least significant digit first.
struct Radix {
  std::array<int64_t, 4> sizes{1, 1, 1, 1};

  int64_t stride(int dim) const {
    int64_t s = 1;
    for (int i = 0; i < dim; ++i) s *= sizes[i];
    return s;
  }
  int64_t digit(int64_t rank, int dim) const { return rank / stride(dim) % sizes[dim]; }
};

}  // namespace

RankGrid::RankGrid(const GridSizes& sizes, int64_t num_experts) : sizes_(sizes) {
  const int64_t world = sizes.world;
  if (world < 1 || world > INT_MAX)
    MOE_BAD_INPUT("the world size " << world << " is out of range: mpirun -np N needs N between 1 and " << INT_MAX);
  // The upper bound keeps the products below exact; sizes past the world size get the messages below.
  auto check_range = [&](const char* key, int64_t value, int64_t lowest, const char* meaning) {
    if (value < lowest || value > INT_MAX)
      MOE_BAD_INPUT(key << " = " << value << " is out of range: it must be " << meaning << " and at most " << INT_MAX
                        << "; the world size is " << world << " (mpirun -np " << world << ")");
  };
  check_range("parallel.tp", sizes.tp, 1, ">= 1");
  check_range("parallel.pp", sizes.pp, 1, ">= 1");
  check_range("parallel.dp", sizes.dp, 0, ">= 1 (or 0 / \"auto\" for world size / (parallel.tp * parallel.pp))");
  check_range("parallel.ep", sizes.ep, 1, ">= 1");
  check_range("parallel.expert_tp", sizes.etp, 1, ">= 1");
  if (num_experts < 0)
    MOE_BAD_INPUT("moe.num_experts = " << num_experts << " must be >= 0 (world size " << world << ")");

  const int64_t tp = sizes.tp, pp = sizes.pp, ep = sizes.ep, etp = sizes.etp;
  const int64_t tp_pp = tp * pp;  // both <= INT_MAX
  if (sizes.dp == 0) {
    if (world % tp_pp != 0)
      MOE_BAD_INPUT("parallel.dp = \"auto\" needs parallel.tp * parallel.pp = "
                    << tp << " * " << pp << " = " << tp_pp << " to divide the world size " << world
                    << ", and it does not; use mpirun -np " << tp_pp << " (or a multiple of " << tp_pp
                    << ") or choose parallel.tp and parallel.pp whose product is one of " << divisors_string(world));
    sizes_.dp = world / tp_pp;
  }
  const int64_t dp = sizes_.dp;
  const Wide dense_product = Wide(tp_pp) * dp;
  if (dense_product != world) {
    std::string fix = "use mpirun -np " + wide_string(dense_product);
    if (world % tp_pp == 0) {
      fix += " or set parallel.dp to " + std::to_string(world / tp_pp) + " or \"auto\"";
    } else {
      fix += " or choose parallel.tp and parallel.pp whose product is one of " + divisors_string(world);
    }
    MOE_BAD_INPUT("parallel.tp * parallel.pp * parallel.dp = " << tp << " * " << pp << " * " << dp << " = "
                                                               << wide_string(dense_product)
                                                               << ", but the world size is " << world << "; " << fix);
  }

  // One pipeline stage holds tp * dp ranks; the expert layers fold the same ranks as etp * ep * edp.
  const int64_t stage = tp * dp;
  const int64_t etp_ep = etp * ep;
  if (stage % etp_ep != 0) {
    std::string fix;
    if (stage % etp == 0) {
      fix = "with parallel.expert_tp = " + std::to_string(etp) + ", parallel.ep can be one of " +
            divisors_string(stage / etp, num_experts);  // num_experts 0: no condition
    } else {
      fix = "parallel.expert_tp can be one of " + divisors_string(stage) +
            ", and parallel.expert_tp * parallel.ep must divide " + std::to_string(stage);
    }
    MOE_BAD_INPUT("parallel.expert_tp * parallel.ep = "
                  << etp << " * " << ep << " = " << etp_ep << " does not divide parallel.tp * parallel.dp = " << tp
                  << " * " << dp << " = " << stage << " (the ranks of one pipeline stage; world size " << world
                  << ", parallel.pp = " << pp << "); " << fix);
  }
  edp_ = stage / etp_ep;

  if (num_experts > 0 && num_experts % ep != 0)
    MOE_BAD_INPUT("moe.num_experts = " << num_experts << " is not divisible by parallel.ep = " << ep << " (world size "
                                       << world
                                       << "): every expert-parallel rank holds the same number of experts; "
                                          "with parallel.tp * parallel.dp = "
                                       << stage << " and parallel.expert_tp = " << etp << ", parallel.ep can be one of "
                                       << divisors_string(stage / etp, num_experts));
}

namespace {

// The decomposition that `kind` belongs to and the digits it varies (one or two; `high` = `low` for one).
struct KindDigits {
  Radix radix;
  int low = 0, high = 0;
  int64_t low_size() const { return radix.sizes[low]; }
  int64_t high_size() const { return high == low ? 1 : radix.sizes[high]; }
  // The group's smallest rank: `rank` with the varied digits set to zero.
  int64_t first(int64_t rank) const {
    int64_t base = rank - radix.digit(rank, low) * radix.stride(low);
    if (high != low) base -= radix.digit(rank, high) * radix.stride(high);
    return base;
  }
};

KindDigits kind_digits(const GridSizes& s, int64_t edp, GroupKind kind) {
  const Radix dense{{s.tp, s.dp, s.pp, 1}};
  const Radix expert{{s.etp, s.ep, edp, s.pp}};
  switch (kind) {
    case GroupKind::Tp:
      return {dense, 0, 0};
    case GroupKind::Dp:
      return {dense, 1, 1};
    case GroupKind::Pp:
      return {dense, 2, 2};
    case GroupKind::Etp:
      return {expert, 0, 0};
    case GroupKind::Ep:
      return {expert, 1, 1};
    case GroupKind::Edp:
      return {expert, 2, 2};
    case GroupKind::TpDp:
      return {dense, 0, 1};
    case GroupKind::Mp:
      return {dense, 0, 2};
  }
  MOE_FAIL("unknown group kind " << int(kind));
}

}  // namespace

RankCoords RankGrid::coords(int64_t rank) const {
  MOE_CHECK(rank >= 0 && rank < sizes_.world, "rank " << rank << " outside the world of " << sizes_.world);
  const Radix dense{{sizes_.tp, sizes_.dp, sizes_.pp, 1}};
  const Radix expert{{sizes_.etp, sizes_.ep, edp_, sizes_.pp}};
  RankCoords c;
  c.tp = dense.digit(rank, 0);
  c.dp = dense.digit(rank, 1);
  c.pp = dense.digit(rank, 2);
  c.etp = expert.digit(rank, 0);
  c.ep = expert.digit(rank, 1);
  c.edp = expert.digit(rank, 2);
  return c;
}

std::vector<int64_t> RankGrid::group(int64_t rank, GroupKind kind) const {
  MOE_CHECK(rank >= 0 && rank < sizes_.world, "rank " << rank << " outside the world of " << sizes_.world);
  const KindDigits kd = kind_digits(sizes_, edp_, kind);
  const int64_t first = kd.first(rank), low_stride = kd.radix.stride(kd.low), high_stride = kd.radix.stride(kd.high);
  // The low digit varies fastest: ascending, and a member's position is its coordinate in the group.
  std::vector<int64_t> members;
  members.reserve(static_cast<size_t>(kd.low_size() * kd.high_size()));
  for (int64_t high = 0; high < kd.high_size(); ++high)
    for (int64_t low = 0; low < kd.low_size(); ++low) members.push_back(first + low * low_stride + high * high_stride);
  return members;
}

int64_t RankGrid::group_id(int64_t rank, GroupKind kind) const {
  MOE_CHECK(rank >= 0 && rank < sizes_.world, "rank " << rank << " outside the world of " << sizes_.world);
  return kind_digits(sizes_, edp_, kind).first(rank);
}

int64_t RankGrid::pipeline_neighbor(int64_t rank, int64_t offset) const {
  const RankCoords c = coords(rank);
  const int64_t stage = c.pp + offset;
  if (stage < 0 || stage >= sizes_.pp) return -1;
  return rank_of(c.tp, c.dp, stage);
}

int64_t RankGrid::rank_of(int64_t tp, int64_t dp, int64_t pp) const {
  MOE_CHECK(tp >= 0 && tp < sizes_.tp && dp >= 0 && dp < sizes_.dp && pp >= 0 && pp < sizes_.pp,
            "coordinates (tp " << tp << ", dp " << dp << ", pp " << pp << ") outside the grid (" << sizes_.tp << ", "
                               << sizes_.dp << ", " << sizes_.pp << ")");
  return tp + sizes_.tp * (dp + sizes_.dp * pp);
}

}  // namespace moe
