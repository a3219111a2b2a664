// Reference causal attention over packed sequences: the readable specification.
#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace rlf {

template <typename T>
void ref::attention_forward(T* out, T* lse, const T* q, const T* k, const T* v,
                            const int* seq_offsets, int S, int H, int D) {
  const T scale = T(1) / std::sqrt(T(D));
  const int64_t row = int64_t(H) * D;  // stride between tokens
  std::vector<T> p;
  for (int s = 0; s < S; ++s) {
    const int64_t start = seq_offsets[s], end = seq_offsets[s + 1];
    p.resize(size_t(std::max<int64_t>(0, end - start)));
    for (int h = 0; h < H; ++h) {
      for (int64_t i = start; i < end; ++i) {
        const T* qi = q + i * row + int64_t(h) * D;
        // Scaled scores against keys start..i, and their maximum.
        T max_score = -std::numeric_limits<T>::infinity();
        for (int64_t j = start; j <= i; ++j) {
          const T* kj = k + j * row + int64_t(h) * D;
          T dot = 0;
          for (int d = 0; d < D; ++d) dot += qi[d] * kj[d];
          p[j - start] = dot * scale;
          max_score = std::max(max_score, p[j - start]);
        }
        T sum = 0;
        for (int64_t j = start; j <= i; ++j) {
          p[j - start] = std::exp(p[j - start] - max_score);
          sum += p[j - start];
        }
        T* oi = out + i * row + int64_t(h) * D;
        for (int d = 0; d < D; ++d) oi[d] = 0;
        for (int64_t j = start; j <= i; ++j) {
          const T w = p[j - start] / sum;
          const T* vj = v + j * row + int64_t(h) * D;
          for (int d = 0; d < D; ++d) oi[d] += w * vj[d];
        }
        lse[i * H + h] = max_score + std::log(sum);
      }
    }
  }
}

template <typename T>
void ref::attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse,
                             const T* q, const T* k, const T* v, const int* seq_offsets, int S,
                             int H, int D) {
  if (!dq && !dk && !dv) return;
  const T scale = T(1) / std::sqrt(T(D));
  const int64_t row = int64_t(H) * D;
  for (int s = 0; s < S; ++s) {
    const int64_t start = seq_offsets[s], end = seq_offsets[s + 1];
    for (int h = 0; h < H; ++h) {
      for (int64_t i = start; i < end; ++i) {
        const int64_t hi = i * row + int64_t(h) * D;
        const T* qi = q + hi;
        const T* doi = dout + hi;
        // rowsum(dO * O): the softmax backward's correction term for query i.
        T delta = 0;
        for (int d = 0; d < D; ++d) delta += doi[d] * out[hi + d];
        const T lse_i = lse[i * H + h];
        for (int64_t j = start; j <= i; ++j) {
          const int64_t hj = j * row + int64_t(h) * D;
          const T* kj = k + hj;
          const T* vj = v + hj;
          T score = 0;
          for (int d = 0; d < D; ++d) score += qi[d] * kj[d];
          const T p = std::exp(score * scale - lse_i);
          if (dv) {
            for (int d = 0; d < D; ++d) dv[hj + d] += p * doi[d];
          }
          T dp = 0;
          for (int d = 0; d < D; ++d) dp += doi[d] * vj[d];
          const T ds = p * (dp - delta);
          if (dq) {
            for (int d = 0; d < D; ++d) dq[hi + d] += ds * kj[d] * scale;
          }
          if (dk) {
            for (int d = 0; d < D; ++d) dk[hj + d] += ds * qi[d] * scale;
          }
        }
      }
    }
  }
}

template <typename T>
void ref::attention_decode(T* out, const T* q, const T* k_cache, const T* v_cache,
                           const int* cache_slots, const int* cache_lens, int B, int H, int D,
                           int max_len) {
  const T scale = T(1) / std::sqrt(T(D));
  const int64_t row = int64_t(H) * D;
  std::vector<T> p(size_t(std::max(0, max_len)));
  for (int b = 0; b < B; ++b) {
    const int64_t len = cache_lens[b];
    const int64_t base = int64_t(cache_slots[b]) * max_len * row;  // first position of the slot
    for (int h = 0; h < H; ++h) {
      const T* qb = q + int64_t(b) * row + int64_t(h) * D;
      T* ob = out + int64_t(b) * row + int64_t(h) * D;
      T max_score = -std::numeric_limits<T>::infinity();
      for (int64_t t = 0; t < len; ++t) {
        const T* kt = k_cache + base + t * row + int64_t(h) * D;
        T dot = 0;
        for (int d = 0; d < D; ++d) dot += qb[d] * kt[d];
        p[t] = dot * scale;
        max_score = std::max(max_score, p[t]);
      }
      T sum = 0;
      for (int64_t t = 0; t < len; ++t) {
        p[t] = std::exp(p[t] - max_score);
        sum += p[t];
      }
      for (int d = 0; d < D; ++d) ob[d] = 0;
      for (int64_t t = 0; t < len; ++t) {
        const T w = p[t] / sum;
        const T* vt = v_cache + base + t * row + int64_t(h) * D;
        for (int d = 0; d < D; ++d) ob[d] += w * vt[d];
      }
    }
  }
}

template void ref::attention_forward<float>(float*, float*, const float*, const float*,
                                            const float*, const int*, int, int, int);
template void ref::attention_forward<double>(double*, double*, const double*, const double*,
                                             const double*, const int*, int, int, int);
template void ref::attention_backward<float>(float*, float*, float*, const float*, const float*,
                                             const float*, const float*, const float*, const float*,
                                             const int*, int, int, int);
template void ref::attention_backward<double>(double*, double*, double*, const double*,
                                              const double*, const double*, const double*,
                                              const double*, const double*, const int*, int, int,
                                              int);
template void ref::attention_decode<float>(float*, const float*, const float*, const float*,
                                           const int*, const int*, int, int, int, int);
template void ref::attention_decode<double>(double*, const double*, const double*, const double*,
                                            const int*, const int*, int, int, int, int);

}  // namespace rlf
