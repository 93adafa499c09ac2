// The rank grid: one pure function from the parallel sizes to every rank's coordinates and groups, for
// dense layers (tp, dp, pp) and expert layers (etp, ep, edp) over the same ranks and the same pipeline
// stages, folded the way Megatron-Core folds them:
//   dense:  rank = tp_rank  + tp  * (dp_rank  + dp  * pp_rank)
//   expert: rank = etp_rank + etp * (ep_rank  + ep  * (edp_rank + edp * pp_rank))
// with tp * dp = etp * ep * edp (both cover one pipeline stage). No MPI here: tested exhaustively alone.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moe {

struct GridSizes {
  int64_t world = 1;
  int64_t tp = 1, pp = 1;
  int64_t dp = 0;  // 0: "auto" = world / (tp * pp)
  int64_t ep = 1;
  int64_t etp = 1;  // expert tensor parallelism
};

struct RankCoords {
  int64_t tp = 0, dp = 0, pp = 0;    // dense layers
  int64_t etp = 0, ep = 0, edp = 0;  // expert layers (pp is shared)
};

// TpDp: the ranks of one pipeline stage. Mp: the model-parallel group (tp x pp, Megatron-Core's
// model_parallel_group): the ranks that hold one replica of the model, those with the same dp coordinate.
enum class GroupKind { Tp, Dp, Pp, Etp, Ep, Edp, TpDp, Mp };
const char* group_kind_name(GroupKind kind);

class RankGrid {
 public:
  // Resolves dp (when 0) and edp; throws moe::Error(BadInput) naming the config keys when the sizes do
  // not multiply out to the world size, or ep * etp does not divide tp * dp. num_experts > 0 also
  // requires ep to divide it (parallel.ep and moe.num_experts named in the message).
  RankGrid(const GridSizes& sizes, int64_t num_experts = 0);

  const GridSizes& sizes() const { return sizes_; }  // dp resolved
  int64_t edp() const { return edp_; }
  RankCoords coords(int64_t rank) const;
  // The ranks of `rank`'s group of this kind, ascending; rank's position in it is its coordinate.
  std::vector<int64_t> group(int64_t rank, GroupKind kind) const;
  // A number identifying the group (equal for the ranks of one group, distinct between groups), usable
  // as the colour of MPI_Comm_split.
  int64_t group_id(int64_t rank, GroupKind kind) const;
  // The rank of the same tp and dp coordinates `offset` pipeline stages away (-1: previous, +1: next), or
  // -1 when that stage does not exist (no wrap-around). Its expert coordinates equal this rank's too.
  int64_t pipeline_neighbor(int64_t rank, int64_t offset) const;
  // The rank at the given dense coordinates.
  int64_t rank_of(int64_t tp, int64_t dp, int64_t pp) const;
  // Experts [first, first + count) held by a rank of this expert-parallel coordinate.
  int64_t experts_per_rank(int64_t num_experts) const { return num_experts / sizes_.ep; }

 private:
  GridSizes sizes_;
  int64_t edp_ = 1;
};

}  // namespace moe
