#include "src/model/expert_table.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace rlf {

int64_t expert_bucket_elements(const ModelConfig& config) {
  return 3 * int64_t(config.d_ff) * config.d_model;
}

int expert_buckets_missing(ExpertShard held, ExpertShard wanted, int layers) {
  const int first = std::max(held.first, wanted.first);
  const int both = std::min(held.first + held.count, wanted.first + wanted.count) - first;
  return layers * (wanted.count - std::max(both, 0));
}

int expert_buckets_missing_any_placement(int held_count, ExpertShard wanted, int experts,
                                         int layers) {
  return layers * std::min(wanted.count, std::max(experts - held_count, 0));
}

template <typename T>
ExpertTable<T>::ExpertTable(const ParameterLayout& layout, T* base)
    : ExpertTable(expert_layers(layout), {layout.first_expert(), layout.stored_experts()}) {
  for (int l = 0; l < layers(); ++l) {
    if (!layout.stores_layer(l)) continue;  // a pipeline stage's layers only
    const LayerOffsets& o = layout.layer(l);
    const ParameterTensor& w1 = *layout.find("layers." + std::to_string(l) + ".experts.w1");
    const int64_t per_expert = w1.numel / w1.shape[0];  // F C: w1, w3 and w2 alike
    for (int s = 0; s < shard_.count; ++s) {
      set(l, shard_.first + s, base + o.w1 + s * per_expert, base + o.w3 + s * per_expert,
          base + o.w2 + s * per_expert);
    }
  }
}

template <typename T>
ExpertTable<T>::ExpertTable(int layers, ExpertShard shard) : shard_(shard) {
  if (layers < 0 || shard.first < 0 || shard.count < 1) {
    throw std::invalid_argument("ExpertTable: " + std::to_string(layers) + " layers of experts [" +
                                std::to_string(shard.first) + ", " +
                                std::to_string(shard.first + shard.count) + ")");
  }
  w1_.assign(size_t(layers), std::vector<T*>(size_t(shard.count), nullptr));
  w3_ = w1_;
  w2_ = w1_;
}

template <typename T>
size_t ExpertTable<T>::index(int layer, int expert) const {
  if (layer < 0 || layer >= layers() || expert < shard_.first ||
      expert >= shard_.first + shard_.count) {
    throw std::out_of_range("ExpertTable: layer " + std::to_string(layer) + ", expert " +
                            std::to_string(expert) + " is not in the table");
  }
  return size_t(expert - shard_.first);
}

template <typename T>
void ExpertTable<T>::set(int layer, int expert, T* w1, T* w3, T* w2) {
  const size_t i = index(layer, expert);
  w1_[size_t(layer)][i] = w1;
  w3_[size_t(layer)][i] = w3;
  w2_[size_t(layer)][i] = w2;
}

template <typename T>
void ExpertTable<T>::set_bucket(int layer, int expert, T* bucket, int F, int C) {
  const int64_t FC = int64_t(F) * C;
  set(layer, expert, bucket, bucket + FC, bucket + 2 * FC);
}

template <typename T>
bool ExpertTable<T>::complete() const {
  for (const auto* table : {&w1_, &w3_, &w2_})
    for (const std::vector<T*>& layer : *table)
      for (const T* p : layer)
        if (!p) return false;
  return true;
}

template class ExpertTable<float>;
template class ExpertTable<double>;

}  // namespace rlf
