#include "src/model/optimizer.h"

#include <cmath>
#include <cstring>

#include "kernels/arena.h"

namespace rlf {

std::function<double(const std::vector<double>&)> sum_in_rank_order(MPI_Comm comm) {
  return [comm](const std::vector<double>& per_slot) {
    int ranks = 1;
    MPI_Comm_size(comm, &ranks);
    std::vector<double> all(size_t(ranks), 0.0);
    MPI_Allgather(per_slot.data(), 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, comm);
    double sum = 0;
    for (double part : all) sum += part;
    return sum;
  };
}

template <typename T>
AdamW<T>::AdamW(Transformer<T>& model, const AdamWHyper& hyper, float max_grad_norm)
    : model_(model), hyper_(hyper), max_grad_norm_(max_grad_norm) {
  const size_t n = size_t(model.parameter_count());
  m_ = model.device().template allocate_zeroed<T>(n, "optimizer first moment");
  v_ = model.device().template allocate_zeroed<T>(n, "optimizer second moment");
}

template <typename T>
double AdamW<T>::step() {
  const auto& ops = model_.ops();
  T* params = model_.parameters();
  T* grads = model_.gradients();
  if (!shard_) {
    const int64_t n = model_.parameter_count();
    const double norm = std::sqrt(ops.grad_norm_squared(grads, n, model_.device()));
    ++step_;
    ops.adamw_update(params, grads, m_, v_, n, hyper_, step_, clip_scale(norm, max_grad_norm_),
                     model_.device());
    return norm;
  }
  auto squared = [&](const std::vector<ParameterRange>& ranges) {
    double sum = 0;
    for (const ParameterRange& r : ranges)
      sum += ops.grad_norm_squared(grads + r.offset, r.count, model_.device());
    return sum;
  };
  std::vector<double> per_slot;
  for (const std::vector<ParameterRange>& slot : shard_->owned_slots)
    per_slot.push_back(squared(slot));
  const double norm = std::sqrt(squared(shard_->replicated) + shard_->sum_over_group(per_slot));
  ++step_;
  const float scale = clip_scale(norm, max_grad_norm_);
  // AdamW is elementwise, so updating range by range equals one update of the whole buffer.
  for (const auto* ranges : {&shard_->replicated, &shard_->owned}) {
    for (const ParameterRange& r : *ranges) {
      ops.adamw_update(params + r.offset, grads + r.offset, m_ + r.offset, v_ + r.offset, r.count,
                       hyper_, step_, scale, model_.device());
    }
  }
  return norm;
}

template class AdamW<float>;
template class AdamW<double>;

}  // namespace rlf
