#include "kernels/arena.h"

#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "kernels/error.h"
#include "kernels/gpu.h"
#include "kernels/huge_pages.h"

namespace rlf {

Arena::Arena(std::string name, size_t capacity_bytes, MemoryKind kind)
    : name_(std::move(name)),
      kind_(kind),
      capacity_((capacity_bytes + kAlignment - 1) / kAlignment * kAlignment) {
  if (capacity_ == 0) return;
  if (kind_ != MemoryKind::Host) {
    base_ = static_cast<std::byte*>(kind_ == MemoryKind::CudaManaged
                                        ? cuda_alloc_managed(capacity_, "arena '" + name_ + "'")
                                        : cuda_alloc_pinned(capacity_, "arena '" + name_ + "'"));
    return;
  }
  // Untouched pages cost nothing on Linux, so reserving the whole capacity up front is cheap and
  // keeps every pointer stable for the arena's lifetime. On huge pages (huge_pages.h): the
  // parameters, gradients, moments and activations all live here, and their first touch is mostly
  // page faults on small pages.
  base_ = static_cast<std::byte*>(allocate_host_buffer(capacity_, kAlignment));
  if (!base_) {
    throw OutOfDeviceMemory("cannot reserve " + format_bytes(capacity_) + " for arena '" + name_ +
                            "'");
  }
}

Arena::~Arena() {
  if (kind_ == MemoryKind::Host) {
    free_host_buffer(base_);
  } else if (base_) {
    cuda_free(base_, kind_);
  }
}

void* Arena::allocate_bytes(size_t bytes, const char* what) {
  const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded > capacity_ - used_) {
    throw OutOfDeviceMemory("arena '" + name_ + "' is too small: allocating " +
                            format_bytes(rounded) + " for " + what + " with " +
                            format_bytes(used_) + " of " + format_bytes(capacity_) +
                            " in use (raise --device-memory)");
  }
  void* p = base_ + used_;
  used_ += rounded;
  if (used_ > peak_) peak_ = used_;
  if (used_ > phase_peak_) phase_peak_ = used_;
  return p;
}

void Arena::zero(void* p, size_t bytes) const {
  zero_memory(p, bytes, kind_);
}

void Arena::zero_streaming(void* p, size_t bytes) const {
  zero_memory_streaming(p, bytes, kind_);
}

void Arena::release(Mark mark) {
  if (mark > used_) throw std::logic_error("Arena::release: mark beyond current use");
  used_ = mark;
}

std::string format_bytes(size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = double(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, unit == 0 ? "%.0f %s" : "%.2f %s", value, units[unit]);
  return buf;
}

}  // namespace rlf
