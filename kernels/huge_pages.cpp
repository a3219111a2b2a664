#include "kernels/huge_pages.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>

namespace rlf {

void* allocate_host_buffer(size_t bytes, size_t alignment) {
  if (bytes < kHugePageBytes) {
    alignment = std::max(alignment, alignof(std::max_align_t));
    return std::aligned_alloc(alignment,
                              (std::max<size_t>(bytes, 1) + alignment - 1) / alignment * alignment);
  }
  const size_t rounded = (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  void* p = std::aligned_alloc(std::max(alignment, kHugePageBytes), rounded);
  // Advice only: without transparent huge pages (or on a kernel that refuses it) the buffer is
  // the same memory on small pages.
  if (p) madvise(p, rounded, MADV_HUGEPAGE);
  return p;
}

void free_host_buffer(void* p) {
  std::free(p);
}

}  // namespace rlf
