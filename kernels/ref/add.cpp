// Reference element-wise sum: the plain loop.
#include "kernels/add.h"

namespace rlf::ref {

template <typename T>
void add(T* out, const T* a, const T* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template void add<float>(float*, const float*, const float*, int64_t);
template void add<double>(double*, const double*, const double*, int64_t);

}  // namespace rlf::ref
