// A device: where a rank computes. On the CPU it is the cores bound to the rank (oneTBB limited
// to them) plus a memory arena of configured capacity standing in for device memory, so offload,
// onload and peak memory are real code paths with real numbers. A CUDA device (Backend::Cuda)
// runs the kernels of kernels/cuda/ on the process's GPU, and its arena is CUDA managed memory of
// the same capacity: the model, the optimizer and host-side code keep using the same pointers.
// Memory for host offload next to it is pinned (host_memory_kind()).
#pragma once

#include <memory>
#include <string>

#include "kernels/arena.h"
#include "kernels/gpu.h"
#include "kernels/ops.h"
#include "kernels/parallel.h"

namespace rlf {

class Device {
 public:
  Device(Backend backend, size_t memory_bytes, int threads)
      : backend_(backend),
        threads_(threads),
        memory_("device", memory_bytes, memory_kind_for(backend)) {
    flush_denormals_to_zero();
  }

  static MemoryKind memory_kind_for(Backend backend) {
    return backend == Backend::Cuda ? MemoryKind::CudaManaged : MemoryKind::Host;
  }

  Backend backend() const { return backend_; }
  const Ops<float>& ops() const { return ops_for(backend_); }
  Arena& memory() { return memory_; }
  // Kind of further device arenas (a second model next to this one).
  MemoryKind memory_kind() const { return memory_.kind(); }
  // Kind of host memory that exchanges data with this device (offload, host-resident models).
  MemoryKind host_memory_kind() const {
    return backend_ == Backend::Cuda ? MemoryKind::CudaPinned : MemoryKind::Host;
  }
  int threads() const { return threads_.threads(); }
  std::string describe() const {
    if (backend_ == Backend::Cuda) {
      return "cuda device (" + cuda_device_description() + "), " +
             format_bytes(memory_.capacity()) + " managed memory, " + std::to_string(threads()) +
             " host threads";
    }
    return std::string(backend_name(backend_)) + " device, " + std::to_string(threads()) +
           " threads, " + format_bytes(memory_.capacity()) + " memory";
  }

 private:
  Backend backend_;
  ThreadLimit threads_;
  Arena memory_;
};

}  // namespace rlf
