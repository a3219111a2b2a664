// A device: where a rank computes. On the CPU build it is the cores bound to the rank (oneTBB
// limited to them) plus a memory arena of configured capacity standing in for device memory, so
// offload, onload and peak memory are real code paths with real numbers. The CUDA build adds a
// device whose arena is cudaMalloc'ed and whose ops run on streams.
#pragma once

#include <memory>
#include <string>

#include "kernels/arena.h"
#include "kernels/ops.h"
#include "kernels/parallel.h"

namespace rlf {

class Device {
 public:
  Device(Backend backend, size_t memory_bytes, int threads)
      : backend_(backend), threads_(threads), memory_("device", memory_bytes) {
    flush_denormals_to_zero();
  }

  Backend backend() const { return backend_; }
  const Ops<float>& ops() const { return ops_for(backend_); }
  Arena& memory() { return memory_; }
  int threads() const { return threads_.threads(); }
  std::string describe() const {
    return std::string(backend_name(backend_)) + " device, " + std::to_string(threads()) +
           " threads, " + format_bytes(memory_.capacity()) + " memory";
  }

 private:
  Backend backend_;
  ThreadLimit threads_;
  Arena memory_;
};

}  // namespace rlf
