#include "src/model/parameter_layout.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/rng.h"

namespace rlf {

bool LayerShard::stores_layer(int layer) const {
  if (layers.empty()) return true;
  for (int l : layers) {
    if (l == layer) return true;
  }
  return false;
}

ParameterLayout::ParameterLayout(const ModelConfig& config, ExpertShard shard,
                                 LayerShard layer_shard, TensorSlice tensor_slice)
    : tensor_slice_(tensor_slice), layer_shard_(layer_shard) {
  const int64_t C = config.d_model, V = config.vocab_size, E = config.n_experts, F = config.d_ff;
  const int64_t S = config.shared_expert_d_ff;
  if (shard.count < 0) shard = {0, config.n_experts};
  if (shard.first < 0 || shard.count < 1 || shard.first + shard.count > config.n_experts) {
    throw std::invalid_argument("ParameterLayout: experts [" + std::to_string(shard.first) + ", " +
                                std::to_string(shard.first + shard.count) +
                                ") are not within the " + std::to_string(config.n_experts) +
                                " experts of the model");
  }
  if (shard.redundant < 0 ||
      (shard.redundant > 0 &&
       (shard.first % shard.count != 0 || shard.count + shard.redundant > config.n_experts))) {
    throw std::invalid_argument("ParameterLayout: " + std::to_string(shard.redundant) +
                                " redundant slots beside experts [" + std::to_string(shard.first) +
                                ", " + std::to_string(shard.first + shard.count) +
                                ") do not fit distinct experts of the " +
                                std::to_string(config.n_experts));
  }
  const TensorSlice& tp = tensor_slice;
  if (tp.size < 1 || tp.rank < 0 || tp.rank >= tp.size || config.n_heads % tp.size != 0 ||
      (tp.splits_shared_expert() && S % tp.size != 0)) {
    throw std::invalid_argument(
        "ParameterLayout: tensor slice " + std::to_string(tp.rank) + " of " +
        std::to_string(tp.size) + " does not divide the model's " + std::to_string(config.n_heads) +
        " heads" +
        (tp.splits_shared_expert() ? " and shared expert width " + std::to_string(S) : ""));
  }
  local_heads_ = config.n_heads / tp.size;
  attention_width_ = local_heads_ * config.head_dim();
  shared_width_ = int(tp.splits_shared_expert() ? S / tp.size : S);
  using Split = ParameterTensor::TensorSplit;
  own_first_ = shard.first;
  own_count_ = shard.count;
  redundant_slots_ = shard.redundant;
  // With redundant slots the rows are this EP rank's slots (ExpertShard).
  stored_experts_ = shard.count + shard.redundant;
  first_expert_ = shard.first / shard.count * stored_experts_;
  if (shard.redundant == 0) first_expert_ = shard.first;
  sharded_ = shard.count != config.n_experts || shard.redundant > 0;
  for (int l : layer_shard.layers) {
    if (l < 0 || l >= config.n_layers) {
      throw std::invalid_argument("ParameterLayout: layer " + std::to_string(l) +
                                  " is not one of the " + std::to_string(config.n_layers) +
                                  " layers of the model");
    }
  }
  const int64_t L = stored_experts_, first = shard.first;
  storing_ = layer_shard.embedding;
  embedding_ = add("embedding", {V, C});
  for (int l = 0; l < config.n_layers; ++l) {
    storing_ = layer_shard.stores_layer(l);
    const std::string p = "layers." + std::to_string(l) + ".";
    LayerOffsets o{};
    o.attn_norm = add(p + "attn_norm", {C}, true);
    const Split attention_rows = tp.active() ? Split::Rows : Split::None;
    const Split attention_columns = tp.active() ? Split::Columns : Split::None;
    o.wq = add_split(p + "attn.wq", C, C, attention_rows);
    o.wk = add_split(p + "attn.wk", C, C, attention_rows);
    o.wv = add_split(p + "attn.wv", C, C, attention_rows);
    o.wo = add_split(p + "attn.wo", C, C, attention_columns);
    o.ffn_norm = add(p + "ffn_norm", {C}, true);
    o.router = add(p + "router", {E, C});
    o.w1 = add(p + "experts.w1", {L, F, C}, false, first * F * C);
    o.w3 = add(p + "experts.w3", {L, F, C}, false, first * F * C);
    o.w2 = add(p + "experts.w2", {L, C, F}, false, first * C * F);
    if (storing_) {
      for (size_t t = tensors_.size() - 3; t < tensors_.size(); ++t) {
        tensors_[t].routed_expert = true;
      }
    }
    if (S > 0) {
      const bool split = tp.splits_shared_expert();
      o.shared_w1 = add_split(p + "shared.w1", S, C, split ? Split::Rows : Split::None);
      o.shared_w3 = add_split(p + "shared.w3", S, C, split ? Split::Rows : Split::None);
      o.shared_w2 = add_split(p + "shared.w2", C, S, split ? Split::Columns : Split::None);
    }
    layers_.push_back(o);
  }
  storing_ = layer_shard.head;
  final_norm_ = add("final_norm", {C}, true);
  lm_head_ = add("lm_head", {V, C});
}

int64_t ParameterLayout::add(const std::string& name, std::vector<int64_t> shape,
                             bool is_norm_weight, int64_t source_offset) {
  const int64_t source_index = next_source_index_++;
  if (!storing_) return -1;
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  // Align each tensor to 16 floats (64 bytes) so every tensor starts on a cache line.
  const int64_t offset = (total_ + 15) / 16 * 16;
  tensors_.push_back(
      {name, std::move(shape), offset, numel, is_norm_weight, source_offset, false, source_index});
  total_ = offset + numel;
  return offset;
}

int64_t ParameterLayout::add_split(const std::string& name, int64_t rows, int64_t cols,
                                   ParameterTensor::TensorSplit split) {
  using Split = ParameterTensor::TensorSplit;
  const int64_t parts = tensor_slice_.size, part = tensor_slice_.rank;
  // A tensor of a layer this layout does not store (pipeline stages) is only counted.
  if (split == Split::Rows) {
    const int64_t offset = add(name, {rows / parts, cols}, false, part * (rows / parts) * cols);
    if (offset >= 0) tensors_.back().tp_split = split;
    return offset;
  }
  if (split == Split::Columns) {
    const int64_t offset = add(name, {rows, cols / parts}, false, part * (cols / parts));
    if (offset >= 0) {
      tensors_.back().tp_split = split;
      tensors_.back().source_row_length = cols;
    }
    return offset;
  }
  return add(name, {rows, cols});
}

const ParameterTensor* ParameterLayout::find(const std::string& name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

template <typename T>
void initialize_parameters(T* params, const ParameterLayout& layout, const ModelConfig& config,
                           uint64_t seed) {
  const double residual_scale = 1.0 / std::sqrt(2.0 * config.n_layers);
  for (int64_t i = 0; i < layout.total(); ++i) params[i] = T(0);
  const auto& tensors = layout.tensors();
  for (const ParameterTensor& t : tensors) {
    T* data = params + t.offset;
    if (t.is_norm_weight) {
      for (int64_t i = 0; i < t.numel; ++i) data[i] = T(1);
      continue;
    }
    const bool residual_output = t.name.ends_with("attn.wo") || t.name.ends_with(".w2");
    const double std = config.init_std * (residual_output ? residual_scale : 1.0);
    // Spare expert slots stay zero: their replicas are copied in from the experts' holders.
    const int64_t count = t.routed_expert && layout.redundant_slots() > 0
                              ? t.numel / t.shape[0] * layout.own_experts().count
                              : t.numel;
    for (int64_t i = 0; i < count; ++i) {
      data[i] =
          T(std * philox_normal(seed, uint64_t(t.source_index), uint64_t(t.source_element(i))));
    }
  }
}

template void initialize_parameters<float>(float*, const ParameterLayout&, const ModelConfig&,
                                           uint64_t);
template void initialize_parameters<double>(double*, const ParameterLayout&, const ModelConfig&,
                                            uint64_t);

bool is_expert_tensor(const ParameterTensor& tensor) {
  return tensor.name.find(".experts.") != std::string::npos;
}

int tensor_layer(const ParameterTensor& tensor) {
  static const std::string prefix = "layers.";
  if (tensor.name.rfind(prefix, 0) != 0) return -1;
  return std::stoi(tensor.name.substr(prefix.size()));
}

int expert_layers(const ParameterLayout& layout) {
  int layers = 0;
  for (const ParameterTensor& t : layout.tensors())
    if (is_expert_tensor(t)) layers = std::max(layers, tensor_layer(t) + 1);
  return layers;
}

template <typename T>
void slice_tensor(const ParameterTensor& t, const T* whole_tensor, T* slice) {
  if (t.tp_split != ParameterTensor::TensorSplit::Columns) {
    std::memcpy(slice, whole_tensor + t.source_offset, size_t(t.numel) * sizeof(T));
    return;
  }
  const int64_t width = t.shape.back();
  for (int64_t at = 0; at < t.numel; at += width) {
    std::memcpy(slice + at, whole_tensor + t.source_element(at), size_t(width) * sizeof(T));
  }
}

template void slice_tensor<float>(const ParameterTensor&, const float*, float*);
template void slice_tensor<double>(const ParameterTensor&, const double*, double*);

}  // namespace rlf
