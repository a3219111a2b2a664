// kernels/gpu.h on the CUDA runtime API (plain C++: no nvcc needed for this file), or stubs in a
// build without CUDA.
#include "kernels/gpu.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>

#include "kernels/error.h"
#include "kernels/streaming_copy.h"

#if defined(RLFUSION_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda_ops.h"
#endif

namespace rlf {

bool built_with_cuda() {
#if defined(RLFUSION_HAVE_CUDA)
  return true;
#else
  return false;
#endif
}

namespace {

[[maybe_unused]] const char* kNoCudaBuild =
    "this rlfusion was built without CUDA (no nvcc was found when it was configured, or "
    "-DRLFUSION_CUDA=OFF)";

#if defined(RLFUSION_HAVE_CUDA)

struct Probe {
  bool usable = false;
  std::string reason;
  int device = -1, count = 0;
};

int local_rank() {
  for (const char* name :
       {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "PMI_LOCAL_RANK"}) {
    if (const char* value = std::getenv(name)) {
      char* end = nullptr;
      const long rank = std::strtol(value, &end, 10);
      if (end != value && rank >= 0) return int(rank);
    }
  }
  return 0;
}

std::string runtime_message(cudaError_t error) {
  return std::string(cudaGetErrorString(error)) + " (" + cudaGetErrorName(error) + ")";
}

const Probe& probe() {
  static const Probe result = [] {
    Probe p;
    cudaError_t error = cudaGetDeviceCount(&p.count);
    if (error != cudaSuccess) {
      cudaGetLastError();
      p.reason = runtime_message(error);
      return p;
    }
    if (p.count == 0) {
      p.reason = "no CUDA-capable device is visible";
      return p;
    }
    p.device = local_rank() % p.count;
    error = cudaSetDevice(p.device);
    if (error == cudaSuccess) error = cudaFree(nullptr);  // creates the context
    if (error != cudaSuccess) {
      cudaGetLastError();
      p.reason = "device " + std::to_string(p.device) + ": " + runtime_message(error);
      return p;
    }
    const std::string image = cuda::kernel_image_error();
    if (!image.empty()) {
      p.reason = "device " + std::to_string(p.device) + ": " + image;
      return p;
    }
    p.usable = true;
    return p;
  }();
  return result;
}

std::string version_text(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

void check(cudaError_t error, const std::string& what) {
  if (error != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error("CUDA error in " + what + ": " + runtime_message(error));
  }
}

#endif

}  // namespace

bool cuda_usable(std::string* reason) {
#if defined(RLFUSION_HAVE_CUDA)
  const Probe& p = probe();
  if (!p.usable && reason) *reason = p.reason;
  return p.usable;
#else
  if (reason) *reason = kNoCudaBuild;
  return false;
#endif
}

std::string cuda_device_description() {
#if defined(RLFUSION_HAVE_CUDA)
  if (!cuda_usable()) return "";
  const Probe& p = probe();
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, p.device) != cudaSuccess) return "CUDA device";
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  return std::string(prop.name) + " (sm_" + std::to_string(prop.major) +
         std::to_string(prop.minor) + ", " + std::to_string(prop.multiProcessorCount) + " SMs, " +
         format_bytes(prop.totalGlobalMem) + ", device " + std::to_string(p.device) + " of " +
         std::to_string(p.count) + "), CUDA runtime " + version_text(runtime) + ", driver " +
         version_text(driver);
#else
  return "";
#endif
}

void cuda_memory_info(size_t* free_bytes, size_t* total_bytes) {
  *free_bytes = 0;
  *total_bytes = 0;
#if defined(RLFUSION_HAVE_CUDA)
  if (!cuda_usable()) return;
  if (cudaMemGetInfo(free_bytes, total_bytes) != cudaSuccess) {
    cudaGetLastError();
    *free_bytes = *total_bytes = 0;
  }
#endif
}

Backend choose_device(const std::string& device, Backend cpu_backend, std::string* note) {
  if (device == "cpu") return cpu_backend;
  if (device != "cuda" && device != "auto") {
    throw ConfigError("--device must be 'cpu', 'cuda' or 'auto', got '" + device + "'");
  }
  std::string reason;
  if (cuda_usable(&reason)) {
    if (cpu_backend == Backend::Reference && device == "cuda") {
      throw ConfigError("--backend ref runs on the CPU; it cannot be combined with --device cuda");
    }
    if (cpu_backend == Backend::Reference) {
      if (note) *note = "--device auto: --backend ref asks for the reference CPU kernels";
      return cpu_backend;
    }
    if (note) *note = "--device " + device + ": CUDA kernels on " + cuda_device_description();
    return Backend::Cuda;
  }
  if (device == "cuda") {
    throw ConfigError(built_with_cuda() ? "--device cuda: no usable CUDA GPU: " + reason
                                        : "--device cuda: " + reason);
  }
  if (note) {
    *note = "--device auto: no usable CUDA GPU (" + reason + "); running on the CPU (" +
            backend_name(cpu_backend) + " kernels)";
  }
  return cpu_backend;
}

void* cuda_alloc_managed(size_t bytes, const std::string& what) {
#if defined(RLFUSION_HAVE_CUDA)
  std::string reason;
  if (!cuda_usable(&reason)) throw ConfigError("CUDA memory for " + what + ": " + reason);
  size_t free_bytes = 0, total_bytes = 0;
  check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  // Managed memory beyond what the GPU has free would be oversubscribed (evicted to the host
  // page by page): refuse it like any arena that is too small.
  if (bytes > free_bytes) {
    throw OutOfDeviceMemory("cannot allocate " + format_bytes(bytes) + " of GPU memory for " +
                            what + ": the GPU has " + format_bytes(free_bytes) + " free of " +
                            format_bytes(total_bytes) + " (lower --device-memory)");
  }
  void* p = nullptr;
  check(cudaMallocManaged(&p, bytes, cudaMemAttachGlobal), "cudaMallocManaged (" + what + ")");
  return p;
#else
  (void)bytes;
  throw ConfigError("CUDA memory for " + what + ": " + kNoCudaBuild);
#endif
}

void* cuda_alloc_pinned(size_t bytes, const std::string& what) {
#if defined(RLFUSION_HAVE_CUDA)
  std::string reason;
  if (!cuda_usable(&reason)) throw ConfigError("pinned memory for " + what + ": " + reason);
  void* p = nullptr;
  check(cudaMallocHost(&p, bytes), "cudaMallocHost (" + what + ")");
  return p;
#else
  (void)bytes;
  throw ConfigError("pinned memory for " + what + ": " + kNoCudaBuild);
#endif
}

void cuda_free(void* p, MemoryKind kind) {
#if defined(RLFUSION_HAVE_CUDA)
  if (!p) return;
  // Errors are ignored: this runs in destructors, possibly after the runtime shut down.
  if (kind == MemoryKind::CudaPinned) {
    cudaFreeHost(p);
  } else {
    cudaFree(p);
  }
  cudaGetLastError();
#else
  (void)p;
  (void)kind;
#endif
}

void* cuda_alloc_device(size_t bytes, const std::string& what) {
#if defined(RLFUSION_HAVE_CUDA)
  std::string reason;
  if (!cuda_usable(&reason)) throw ConfigError("GPU memory for " + what + ": " + reason);
  void* p = nullptr;
  check(cudaMalloc(&p, bytes), "cudaMalloc (" + what + ")");
  return p;
#else
  (void)bytes;
  throw ConfigError("GPU memory for " + what + ": " + kNoCudaBuild);
#endif
}

void cuda_free_device(void* p) {
#if defined(RLFUSION_HAVE_CUDA)
  if (p) cudaFree(p);
  cudaGetLastError();
#else
  (void)p;
#endif
}

namespace {

// cudaMemset of managed memory (and waited for); false, nothing zeroed, for host memory.
bool cuda_zero(void* p, size_t bytes, MemoryKind kind) {
#if defined(RLFUSION_HAVE_CUDA)
  if (kind == MemoryKind::CudaManaged) {
    check(cudaMemset(p, 0, bytes), "cudaMemset");
    // The kernels' non-blocking stream does not wait for the default stream's memset.
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize after cudaMemset");
    return true;
  }
#else
  (void)p, (void)bytes, (void)kind;
#endif
  return false;
}

}  // namespace

void zero_memory(void* p, size_t bytes, MemoryKind kind) {
  if (bytes == 0 || cuda_zero(p, bytes, kind)) return;
  std::memset(p, 0, bytes);
}

void zero_memory_streaming(void* p, size_t bytes, MemoryKind kind) {
  if (bytes == 0 || cuda_zero(p, bytes, kind)) return;
  stream_zero(p, bytes);
}

namespace {

// cudaMemcpy where either side is CUDA memory (and waited for); false, nothing copied, otherwise.
bool cuda_copy(void* dst, const void* src, size_t bytes) {
#if defined(RLFUSION_HAVE_CUDA)
  if (cuda_usable()) {
    auto cuda_memory = [](const void* ptr) {
      cudaPointerAttributes attributes{};
      if (cudaPointerGetAttributes(&attributes, ptr) != cudaSuccess) {
        cudaGetLastError();
        return false;
      }
      return attributes.type != cudaMemoryTypeUnregistered;
    };
    if (cuda_memory(dst) || cuda_memory(src)) {
      check(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "cudaMemcpy");
      // cudaMemcpy returns before a device-to-device copy (and the DMA of a pageable host
      // source) is done, and the kernels run on a non-blocking stream that does not wait for
      // it: wait here, so the bytes are in place when copy_bytes returns.
      check(cudaDeviceSynchronize(), "cudaDeviceSynchronize after cudaMemcpy");
      return true;
    }
  }
#else
  (void)dst, (void)src, (void)bytes;
#endif
  return false;
}

}  // namespace

void copy_bytes(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || cuda_copy(dst, src, bytes)) return;
  std::memcpy(dst, src, bytes);
}

void copy_bytes_streaming(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || cuda_copy(dst, src, bytes)) return;
  stream_copy(dst, src, bytes);
}

}  // namespace rlf
