// Reference token embedding: row gather forward, scatter-add backward in token order.
#include "kernels/embedding.h"

#include <cstdint>
#include <stdexcept>
#include <string>

namespace rlf::ref {
namespace {
void check_token(int token, int64_t n, int V) {
  if (token < 0 || token >= V) {
    throw std::out_of_range("embedding: token " + std::to_string(token) + " at position " +
                            std::to_string(n) + " is outside the vocabulary [0, " +
                            std::to_string(V) + ")");
  }
}
}  // namespace

template <typename T>
void embedding_forward(T* out, const int* tokens, const T* table, int N, int C, int V) {
  for (int64_t n = 0; n < N; ++n) {
    check_token(tokens[n], n, V);
    const T* row = table + int64_t(tokens[n]) * C;
    for (int64_t c = 0; c < C; ++c) out[n * C + c] = row[c];
  }
}

template <typename T>
void embedding_backward(T* dtable, const T* dout, const int* tokens, int N, int C, int V) {
  if (!dtable) return;
  for (int64_t n = 0; n < N; ++n) {
    check_token(tokens[n], n, V);
    T* row = dtable + int64_t(tokens[n]) * C;
    for (int64_t c = 0; c < C; ++c) row[c] += dout[n * C + c];
  }
}

template void embedding_forward<float>(float*, const int*, const float*, int, int, int);
template void embedding_forward<double>(double*, const int*, const double*, int, int, int);
template void embedding_backward<float>(float*, const float*, const int*, int, int, int);
template void embedding_backward<double>(double*, const double*, const int*, int, int, int);

}  // namespace rlf::ref
