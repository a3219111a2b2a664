// Megatron-style tensor parallelism (TP) of the transformer over a TP group of ranks.
//
// Every rank of a TP group runs the same tokens. Attention is cut by heads: Q, K and V are
// column-parallel (each rank holds the rows of wq, wk, wv of its heads, so its Q/K/V are its heads'
// columns), attention runs on the rank's heads only (the KV cache holds only them), and the output
// projection wo is row-parallel (each rank holds the columns of wo that read its heads), so each
// rank's att @ wo^T is a partial sum: one allreduce over the group gives the layer's attention
// output (Megatron's g), and in backward the gradient of the attention norm's output is the
// allreduce of the ranks' partial input gradients of Q, K and V (the conjugate f). The shared
// expert (the dense SwiGLU every token passes through) is cut the same way unless the TP is on
// attention only: w1, w3 column-parallel over its hidden units, w2 row-parallel, one allreduce of
// its output in forward and of its input gradient in backward. Everything else (embedding, norms,
// router, routed experts, LM head) is replicated: every rank computes it on the same
// (bit-identical) inputs.
//
// A rank's layout is a TensorSlice of the unsharded one (src/model/parameter_layout.h), and its
// initialization is exactly its slice of the seeded unsharded initialization. Consequences:
// logits, loss and every replicated tensor's gradient equal the single-rank model's (up to float
// reassociation of the partial sums) and are bit-identical on every rank of the group (the
// allreduce is a ring whose every chunk is summed in a fixed order and then copied), and the
// gradient of a cut tensor is the rank's slice of the single-rank gradient.
//
// Groups: TP groups are consecutive ranks (rank r is TP rank r % T of group r / T: TP innermost, so
// a TP group sits inside a node as Megatron places it); the data-parallel groups are the ranks
// with the same TP rank (one per TP rank, the replicas of its slice).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "mpi_comm/links.h"
#include "mpi_comm/topology.h"
#include "src/model/model_config.h"
#include "src/model/parameter_layout.h"

namespace rlf {

struct OptimizerShard;

// Why TP degree `degree` does not fit `config` and `ranks` ranks (empty when it fits): degree
// below 1, a degree that does not divide the ranks, the attention heads (and so d_model), or,
// unless attention_only, the shared expert's width. Pure arithmetic, so every rank finds the
// same problem before any collective.
std::string tensor_parallel_problem(const ModelConfig& config, int degree, bool attention_only,
                                    int ranks);
// Throws ConfigError "<option> <degree>: <problem>" when tensor_parallel_problem finds one.
void validate_tensor_parallel(const ModelConfig& config, int degree, bool attention_only, int ranks,
                              const std::string& option = "--tensor-parallel");

// Counted TP collectives (per rank, since construction or reset).
struct TensorParallelCounters {
  int64_t allreduces = 0;            // allreduce_sum calls
  int64_t allreduced_elements = 0;   // elements summed by them
  int64_t allgathers = 0;            // allgather_rows calls
  int64_t allgathered_elements = 0;  // elements of the whole buffers they assembled
};

// Rows [first, first + count) of N that TP rank `rank` of `degree` takes when a TP group splits
// its tokens (TP x EP, src/model/moe_block.h): contiguous, in TP-rank order, counts differing by
// at most one (first = N rank / degree), so a rank has no rows when N < degree.
struct RowShare {
  int first = 0, count = 0;
};
RowShare tensor_parallel_row_share(int N, int degree, int rank);

class TensorParallel {
 public:
  // Collective over `comm`: splits it into TP groups of `degree` consecutive ranks and the
  // data-parallel groups across them. Throws ConfigError (validate_tensor_parallel) on every rank
  // when the degree does not fit the model or the ranks of `comm`. `links` (not owned) carries,
  // counts and emulates every message.
  TensorParallel(MPI_Comm comm, int degree, bool attention_only, const ModelConfig& config,
                 Links& links);
  ~TensorParallel();
  TensorParallel(const TensorParallel&) = delete;
  TensorParallel& operator=(const TensorParallel&) = delete;

  int degree() const { return slice_.size; }
  int rank() const { return slice_.rank; }  // rank in the TP group
  bool attention_only() const { return slice_.attention_only; }
  // The slice of the parameters this rank holds (the layout of its Transformer).
  const TensorSlice& slice() const { return slice_; }
  // TP group index (which replica of the model this rank helps hold) and their count.
  int replica() const { return groups_.group; }
  int replicas() const { return groups_.groups; }
  const HierarchicalComm& group() const { return groups_.members; }
  // The ranks with this rank's TP rank, one per replica (data parallelism over the replicas).
  const HierarchicalComm& data_parallel() const { return groups_.across; }
  Links& links() const { return links_; }

  // Sum of data[count] over the TP group, in place; bit-identical on every rank (ring
  // allreduce over the group, src/mpi_comm/hierarchical_collectives.h). Collective over the group.
  void allreduce_sum(float* data, int64_t count) const;
  // Tensor parallelism runs in float only (as expert parallelism): throws std::logic_error.
  void allreduce_sum(double* data, int64_t count) const;
  // This rank's share of N rows (tensor_parallel_row_share).
  RowShare row_share(int N) const { return tensor_parallel_row_share(N, degree(), rank()); }
  // rows[N, width] holds this rank's share (row_share(N)) on entry and every rank's on return:
  // a ring allgather over the group (flat_allgather), every message counted on links().
  // Collective over the group; every rank passes the same N and width.
  void allgather_rows(float* rows, int N, int width) const;

  // AdamW over a TP model (src/model/optimizer.h): a rank updates its slices and its copy of the
  // whole tensors, and the clipping norm counts every element once: the whole tensors' squared
  // norm (the same on every rank of the group) plus the cut tensors' summed over the group in
  // TP-rank order, so the norm, and the clipped step, are bit-identical on every rank.
  OptimizerShard optimizer_shard(const ParameterLayout& layout) const;

  const TensorParallelCounters& counters() const { return counters_; }
  void reset_counters() { counters_ = {}; }

 private:
  TensorSlice slice_;
  ConsecutiveGroups groups_;
  Links& links_;
  mutable TensorParallelCounters counters_;
};

// The layout of `config` with `like`'s expert and layer shards and the tensor slice `slice`.
ParameterLayout with_tensor_slice(const ModelConfig& config, const ParameterLayout& like,
                                  TensorSlice slice);

// The tensors of `layout` that tensor parallelism cuts, adjacent ones merged; and the rest
// (whole on every rank of the group).
std::vector<ParameterRange> tensor_parallel_ranges(const ParameterLayout& layout);
std::vector<ParameterRange> tensor_replicated_ranges(const ParameterLayout& layout);
// The whole tensors other than the routed experts' (with expert parallelism the experts are
// sharded over the EP group, not replicated).
std::vector<ParameterRange> tensor_replicated_dense_ranges(const ParameterLayout& layout);

// A rank's slice of a whole-model buffer: every tensor of `slice_layout` copied from its elements
// in `whole` (laid out by `whole_layout`: the same model, experts and layers, no tensor slice).
// Pure.
template <typename T>
void slice_parameters(const T* whole, const ParameterLayout& whole_layout, T* slice,
                      const ParameterLayout& slice_layout);

// The whole-model buffer from every TP rank's slice (collective over tp.group(); every rank gets
// it): cut tensors assembled from the ranks' slices, whole ones copied from this rank's buffer.
// `slice_layout` is this rank's layout, `whole_layout` the same model without a tensor slice (with
// a layer shard, a pipeline stage: the stage's layers unsliced).
void gather_tensor_parallel(const float* slice, const ParameterLayout& slice_layout, float* whole,
                            const ParameterLayout& whole_layout, const ModelConfig& config,
                            const TensorParallel& tp);

// gather_tensor_parallel onto TP rank 0 only (`whole` may be null on the others), for a sender
// that needs the whole model on one rank (the disaggregated weight sync): every other rank sends
// its cut tensors once (counted on tp.links()). Collective over tp.group(). Returns the bytes TP
// rank 0 received (0 on the others).
uint64_t gather_tensor_parallel_on_rank_zero(const float* slice,
                                             const ParameterLayout& slice_layout, float* whole,
                                             const ParameterLayout& whole_layout,
                                             const ModelConfig& config, const TensorParallel& tp);

// The layout switch from TP degree T (tp) to a degree G dividing it, with generation TP groups of G
// consecutive ranks: `target` (laid out by `target_layout`, the same model, experts and layers as
// `slice_layout` with TensorSlice {tp.rank() % G, G}) gets generation slice tp.rank() % G, made of
// training slices [(t % G) T / G, (t % G + 1) T / G): each rank receives only those of its TP
// mates (an all-to-all inside tp.group(), each slice counted on tp.links()). G = 1 gives the whole
// tensors, G = T this rank's own slice. Collective over tp.group(); std::invalid_argument for
// another target slice. Returns the bytes this rank received.
uint64_t regroup_tensor_slices(const float* slice, const ParameterLayout& slice_layout,
                               float* target, const ParameterLayout& target_layout,
                               const ModelConfig& config, const TensorParallel& tp);

}  // namespace rlf
