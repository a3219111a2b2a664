// Tensor views: a pointer plus shape and strides, owning nothing. Kernels take flat pointers and
// explicit dimensions (llm.c style); views are how the model names and slices its buffers.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

namespace rlf {

inline constexpr int kMaxTensorRank = 4;

template <typename T>
struct TensorView {
  T* data = nullptr;
  int rank = 0;
  std::array<int64_t, kMaxTensorRank> shape{};
  std::array<int64_t, kMaxTensorRank> strides{};  // in elements

  TensorView() = default;
  // Contiguous row-major view.
  TensorView(T* ptr, std::initializer_list<int64_t> dims) : data(ptr), rank(int(dims.size())) {
    if (rank > kMaxTensorRank) throw std::invalid_argument("TensorView: rank > 4");
    int axis = 0;
    for (int64_t d : dims) shape[axis++] = d;
    int64_t stride = 1;
    for (int i = rank - 1; i >= 0; --i) {
      strides[i] = stride;
      stride *= shape[i];
    }
  }

  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= shape[i];
    return n;
  }
  bool contiguous() const {
    int64_t stride = 1;
    for (int i = rank - 1; i >= 0; --i) {
      if (strides[i] != stride) return false;
      stride *= shape[i];
    }
    return true;
  }
  // Row `index` along axis 0 as a view of rank-1 dimensions.
  TensorView<T> row(int64_t index) const {
    TensorView<T> v;
    v.data = data + index * strides[0];
    v.rank = rank - 1;
    for (int i = 1; i < rank; ++i) {
      v.shape[i - 1] = shape[i];
      v.strides[i - 1] = strides[i];
    }
    return v;
  }
  // Rows [begin, end) along axis 0.
  TensorView<T> slice_rows(int64_t begin, int64_t end) const {
    TensorView<T> v = *this;
    v.data = data + begin * strides[0];
    v.shape[0] = end - begin;
    return v;
  }
  T& at(int64_t i) const { return data[i * strides[0]]; }
  T& at(int64_t i, int64_t j) const { return data[i * strides[0] + j * strides[1]]; }
  T& at(int64_t i, int64_t j, int64_t k) const {
    return data[i * strides[0] + j * strides[1] + k * strides[2]];
  }
  std::string shape_string() const {
    std::string s = "[";
    for (int i = 0; i < rank; ++i) {
      if (i) s += ',';
      s += std::to_string(shape[i]);
    }
    s += ']';
    return s;
  }
};

}  // namespace rlf
