// Large host buffers on transparent huge pages. A buffer's first touch faults every page in, and
// on this VM a 4 KiB page's fault costs about 12 us (a 64 MiB buffer: 182-190 ms), so the first
// pass over a fresh arena, a model's parameters or a migration's staging buffer is mostly page
// faults. Linux's transparent huge pages map 2 MiB at a fault instead, for memory advised with
// madvise(MADV_HUGEPAGE) (Debian's default mode, "madvise"): the same 64 MiB first touch took 5-19
// ms (86 ms the very first time, while the kernel compacted memory). Where the kernel has them
// off, the advice is ignored and nothing changes.
#pragma once

#include <cstddef>
#include <new>

namespace rlf {

// Buffers from this size up are aligned to it and advised to use huge pages.
inline constexpr size_t kHugePageBytes = size_t(2) << 20;

// `bytes` of host memory aligned to at least `alignment` (a power of two); from kHugePageBytes up,
// aligned to kHugePageBytes, rounded up to a whole number of them and advised to use huge pages.
// nullptr when the memory cannot be had. Release with free_host_buffer.
void* allocate_host_buffer(size_t bytes, size_t alignment = alignof(std::max_align_t));
void free_host_buffer(void* p);

// A std::allocator for large vectors (allocate_host_buffer's placement and advice).
template <typename T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) {}
  T* allocate(size_t n) {
    void* p = allocate_host_buffer(n * sizeof(T), alignof(T));
    if (!p) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { free_host_buffer(p); }
  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const {
    return true;
  }
};

}  // namespace rlf
