// AdamW over a model's flat parameter buffer, with global-norm clipping. The moments live in the
// same device arena as the parameters (RL Fusion later offloads them to host memory).
#pragma once

#include <mpi.h>

#include <functional>
#include <optional>
#include <vector>

#include "kernels/adamw.h"
#include "src/model/transformer.h"

namespace rlf {

// Expert parallelism: a rank updates only the parameters it owns, its copy of the replicated
// tensors and the slices of its own experts; the clipping norm counts every expert once, so the
// owned experts' squared norms are summed over the EP group. They are summed expert by expert in
// expert-id order, whichever rank holds an expert, so moving experts between ranks (expert
// migration) leaves the norm, and so a clipped step, bit-identical.
struct OptimizerShard {
  std::vector<ParameterRange> replicated;  // the same on every rank of the EP group
  std::vector<ParameterRange> owned;       // this rank's experts, disjoint across the group
  std::vector<std::vector<ParameterRange>> owned_slots;  // the same, one entry per local slot
  // Collective over the EP group: this rank's squared norm per local slot (owned_slots' order) ->
  // the sum over every expert of the group, added in expert-id order.
  std::function<double(const std::vector<double>&)> sum_over_group;
};

// A sum_over_group for shards whose group holds one slot per rank: gathers every rank's value
// over `comm` and adds them in rank order, so every rank gets the same bits.
std::function<double(const std::vector<double>&)> sum_in_rank_order(MPI_Comm comm);

template <typename T>
class AdamW {
 public:
  AdamW(Transformer<T>& model, const AdamWHyper& hyper, float max_grad_norm);

  // Restricts step() to the shard's ranges (parameters outside them are left untouched).
  void set_shard(OptimizerShard shard) { shard_ = std::move(shard); }
  void clear_shard() { shard_.reset(); }

  // Clips, updates the parameters, and returns the gradient norm before clipping.
  double step();
  int steps_taken() const { return step_; }
  // A resumed run continues the step counter (bias correction) of its checkpoint.
  void restore_steps_taken(int steps) { step_ = steps; }
  T* first_moment() const { return m_; }
  T* second_moment() const { return v_; }
  AdamWHyper& hyper() { return hyper_; }

 private:
  Transformer<T>& model_;
  AdamWHyper hyper_;
  float max_grad_norm_;
  T* m_;
  T* v_;
  int step_ = 0;
  std::optional<OptimizerShard> shard_;
};

}  // namespace rlf
