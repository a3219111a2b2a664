// Without oneTBB (the kernels-only build on a GPU machine: RLFUSION_HAVE_TBB undefined) the
// chunks run one after another on the calling thread: same partition, same results.
#include "kernels/parallel.h"

#if defined(RLFUSION_HAVE_TBB)
#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#endif

#include <algorithm>

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace rlf {

#if defined(RLFUSION_HAVE_TBB)
ThreadLimit::ThreadLimit(int threads)
    : threads_(std::max(1, threads)),
      control_(std::make_shared<tbb::global_control>(tbb::global_control::max_allowed_parallelism,
                                                     size_t(std::max(1, threads)))) {}
#else
ThreadLimit::ThreadLimit(int threads) : threads_(std::max(1, threads)) {}
#endif

ThreadLimit::~ThreadLimit() = default;

void flush_denormals_to_zero() {
#if defined(__SSE__)
  constexpr unsigned kFlushToZero = 0x8000, kDenormalsAreZero = 0x0040;
  _mm_setcsr(_mm_getcsr() | kFlushToZero | kDenormalsAreZero);
#endif
}

void parallel_chunks(int64_t n, int64_t grain, const void* context,
                     void (*body)(const void* context, int64_t begin, int64_t end)) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (n <= grain) {
    body(context, 0, n);
    return;
  }
  // Explicit chunks (not TBB's range splitting) so the partition is a pure function of n, grain.
  const int64_t chunks = (n + grain - 1) / grain;
#if !defined(RLFUSION_HAVE_TBB)
  for (int64_t c = 0; c < chunks; ++c) body(context, c * grain, std::min(n, (c + 1) * grain));
#else
  tbb::parallel_for(
      tbb::blocked_range<int64_t>(0, chunks, 1),
      [&](const tbb::blocked_range<int64_t>& r) {
        for (int64_t c = r.begin(); c != r.end(); ++c) {
          body(context, c * grain, std::min(n, (c + 1) * grain));
        }
      },
      tbb::simple_partitioner());
#endif
}

}  // namespace rlf
