// Element-wise sum on the CPU: the reference loop over fixed chunks on oneTBB's threads (each
// element is one add, so the chunking cannot change a bit).
#include "kernels/add.h"

#include "kernels/parallel.h"

namespace rlf::cpu {

void add(float* out, const float* a, const float* b, int64_t n, Arena&) {
  if (n <= 0) return;
  parallel_for_chunks(n, int64_t(1) << 15, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = a[i] + b[i];
  });
}

}  // namespace rlf::cpu
