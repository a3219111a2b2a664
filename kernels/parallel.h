// Threading for CPU kernels: oneTBB limited to the rank's threads, with fixed partitions so that
// results never depend on how many threads ran or how work was stolen.
#pragma once

#include <cstdint>
#include <memory>

namespace rlf {

// Limits oneTBB to `threads` for this object's lifetime (the rank's cores).
class ThreadLimit {
 public:
  explicit ThreadLimit(int threads);
  ~ThreadLimit();
  int threads() const { return threads_; }

 private:
  int threads_;
  std::shared_ptr<void> control_;
};

// Treats denormal floats as zero in this thread and in the oneTBB workers it starts afterwards
// (they inherit the creating thread's floating-point settings). Optimizer moments and small
// gradients decay into the denormal range, where x86 arithmetic is up to 100x slower.
void flush_denormals_to_zero();

// Calls body(begin, end) on chunks of [0, n). Chunk boundaries depend only on n and grain, never
// on the thread count, so a per-chunk partial result is reproducible.
void parallel_chunks(int64_t n, int64_t grain, const void* context,
                     void (*body)(const void* context, int64_t begin, int64_t end));

template <typename Body>
void parallel_for_chunks(int64_t n, int64_t grain, const Body& body) {
  parallel_chunks(n, grain, &body, [](const void* ctx, int64_t b, int64_t e) {
    (*static_cast<const Body*>(ctx))(b, e);
  });
}

// Number of fixed blocks of `block` elements covering n; reductions write one partial per block
// and then sum the partials serially in block order.
inline int64_t num_blocks(int64_t n, int64_t block) {
  return (n + block - 1) / block;
}

}  // namespace rlf
