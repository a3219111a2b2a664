// A device's memory: a bump arena with a fixed capacity, so that "device memory" has real
// limits, real peaks and real offload on a CPU-only machine. Allocation is a pointer bump;
// scoped work buffers are released by rewinding to a mark (stack discipline).
//
// The memory behind it is one allocation of the arena's kind: host memory, CUDA managed memory
// (the CUDA device's arena: kernels and host code use the same pointers, the driver migrates
// pages) or pinned host memory (host offload next to a CUDA device: device-accessible, and
// copies to and from it run at full link speed). The CUDA kinds need a build with CUDA and a
// usable GPU (ConfigError otherwise).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace rlf {

enum class MemoryKind { Host, CudaManaged, CudaPinned };

class Arena {
 public:
  static constexpr size_t kAlignment = 64;

  Arena(std::string name, size_t capacity_bytes, MemoryKind kind = MemoryKind::Host);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // Throws OutOfDeviceMemory naming the arena, the request `what`, and the capacity.
  void* allocate_bytes(size_t bytes, const char* what);
  template <typename T>
  T* allocate(size_t count, const char* what) {
    return static_cast<T*>(allocate_bytes(count * sizeof(T), what));
  }

  template <typename T>
  T* allocate_zeroed(size_t count, const char* what) {
    T* p = allocate<T>(count, what);
    zero(p, count * sizeof(T));
    return p;
  }
  // Zeroes `bytes` at p (memory of this arena) where the kernels use it: managed memory on the
  // GPU (zero_memory), host and pinned memory on the host.
  void zero(void* p, size_t bytes) const;
  // The same with streaming stores on the host (zero_memory_streaming): for a large buffer that is
  // not read again soon.
  void zero_streaming(void* p, size_t bytes) const;

  using Mark = size_t;
  Mark mark() const { return used_; }
  void release(Mark mark);  // frees everything allocated after `mark`

  const std::string& name() const { return name_; }
  MemoryKind kind() const { return kind_; }
  size_t capacity() const { return capacity_; }
  size_t used() const { return used_; }
  size_t peak() const { return peak_; }
  void reset_peak() { peak_ = used_; }
  // A second high-water mark for one phase of work (generation, training), independent of peak().
  void start_phase_peak() { phase_peak_ = used_; }
  size_t phase_peak() const { return phase_peak_; }

 private:
  std::string name_;
  MemoryKind kind_;
  size_t capacity_;
  std::byte* base_ = nullptr;
  size_t used_ = 0;
  size_t peak_ = 0;
  size_t phase_peak_ = 0;
};

// Releases every allocation made in its lifetime: work buffers of one kernel or one phase.
class ArenaScope {
 public:
  explicit ArenaScope(Arena& arena) : arena_(arena), mark_(arena.mark()) {}
  ~ArenaScope() { arena_.release(mark_); }
  ArenaScope(const ArenaScope&) = delete;
  ArenaScope& operator=(const ArenaScope&) = delete;

 private:
  Arena& arena_;
  Arena::Mark mark_;
};

// "1.50 GiB", "12.0 MiB": for messages and tables.
std::string format_bytes(size_t bytes);

}  // namespace rlf
