// runtime.h on the CUDA runtime and cuBLAS, or (RLF_CUDA_EMULATION) on host memory.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/runtime.h"

#if !defined(RLF_CUDA_EMULATION) && defined(RLFUSION_HAVE_CUBLAS)
#include "kernels/cuda/cublas_library.h"
#endif

namespace rlf::RLF_CUDA_NS {
namespace detail {
namespace {

constexpr size_t kAlign = 256;
constexpr size_t kMinChunk = size_t(16) << 20;

size_t round_up(size_t bytes) {
  return (bytes + kAlign - 1) / kAlign * kAlign;
}

#if defined(RLF_CUDA_EMULATION)

// Emulated device memory: host memory whose ranges are remembered, so that device_accessible()
// tells it from plain host memory exactly as cudaPointerGetAttributes would.
struct EmulatedMemory {
  std::mutex mutex;
  std::set<std::pair<uintptr_t, uintptr_t>> ranges;  // [begin, end)
};
EmulatedMemory& emulated() {
  static EmulatedMemory* m = new EmulatedMemory;  // outlives every thread's scratch
  return *m;
}

#else

[[noreturn]] void fail(const char* what, cudaError_t error) {
  throw std::runtime_error(std::string("CUDA error in ") + what + ": " + cudaGetErrorName(error) +
                           " (" + cudaGetErrorString(error) + ")");
}
void check(cudaError_t error, const char* what) {
  if (error != cudaSuccess) fail(what, error);
}

#endif

// The calling thread's stream, cuBLAS handle and scratch chunks; created on first use and never
// destroyed (destroying CUDA objects at process exit races the runtime's own teardown).
struct Context {
#if !defined(RLF_CUDA_EMULATION)
  cudaStream_t stream = nullptr;
#if defined(RLFUSION_HAVE_CUBLAS)
  cublasHandle_t cublas = nullptr;  // null where libcublas could not be opened
#endif
#endif
  struct Chunk {
    char* base;
    size_t bytes;
  };
  std::vector<Chunk> chunks;
  ScratchMark top;
};

Context& context() {
  thread_local Context* ctx = [] {
    auto* c = new Context;
#if !defined(RLF_CUDA_EMULATION)
    check(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "cudaStreamCreate");
#if defined(RLFUSION_HAVE_CUBLAS)
    if (const CublasFunctions* blas = cublas_functions()) {
      if (blas->create(&c->cublas) != CUBLAS_STATUS_SUCCESS) {
        throw std::runtime_error("cuBLAS: cublasCreate failed");
      }
      blas->set_stream(c->cublas, c->stream);
      blas->set_math_mode(c->cublas, CUBLAS_DEFAULT_MATH);  // IEEE fp32, no TF32
    }
#endif
#endif
    return c;
  }();
  return *ctx;
}

}  // namespace

#if defined(RLF_CUDA_EMULATION)

void check_launch(const char*) {}
void synchronize(const char*) {}

void* device_alloc(size_t bytes) {
  const size_t rounded = round_up(std::max<size_t>(bytes, 1));
  void* p = std::aligned_alloc(kAlign, rounded);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0xA5, rounded);  // device memory starts as garbage, not zeros
  EmulatedMemory& m = emulated();
  std::lock_guard<std::mutex> lock(m.mutex);
  m.ranges.insert({uintptr_t(p), uintptr_t(p) + rounded});
  return p;
}

void device_free(void* p) {
  if (!p) return;
  EmulatedMemory& m = emulated();
  {
    std::lock_guard<std::mutex> lock(m.mutex);
    auto it = m.ranges.lower_bound({uintptr_t(p), 0});
    if (it != m.ranges.end() && it->first == uintptr_t(p)) m.ranges.erase(it);
  }
  std::free(p);
}

bool device_accessible(const void* p) {
  EmulatedMemory& m = emulated();
  std::lock_guard<std::mutex> lock(m.mutex);
  const uintptr_t a = uintptr_t(p);
  auto it = m.ranges.upper_bound({a, UINTPTR_MAX});
  if (it == m.ranges.begin()) return false;
  --it;
  return a >= it->first && a < it->second;
}

void copy_async(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memmove(dst, src, bytes);
}
void zero_async(void* p, size_t bytes) {
  if (bytes) std::memset(p, 0, bytes);
}
void copy_sync(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memmove(dst, src, bytes);
}

#else

cudaStream_t stream() {
  return context().stream;
}

void check_launch(const char* what) {
  check(cudaGetLastError(), what);
}

void synchronize(const char* what) {
  check(cudaStreamSynchronize(context().stream), what);
}

void* device_alloc(size_t bytes) {
  void* p = nullptr;
  check(cudaMalloc(&p, round_up(std::max<size_t>(bytes, 1))), "cudaMalloc (kernel scratch)");
  return p;
}

void device_free(void* p) {
  if (p) cudaFree(p);
}

bool device_accessible(const void* p) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
    cudaGetLastError();  // clear: an unknown pointer is host memory
    return false;
  }
  return attributes.type == cudaMemoryTypeManaged || attributes.type == cudaMemoryTypeDevice ||
         (attributes.type == cudaMemoryTypeHost && attributes.devicePointer == p);
}

void copy_async(void* dst, const void* src, size_t bytes) {
  if (bytes) {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, context().stream), "cudaMemcpyAsync");
  }
}
void zero_async(void* p, size_t bytes) {
  if (bytes) check(cudaMemsetAsync(p, 0, bytes, context().stream), "cudaMemsetAsync");
}
void copy_sync(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, context().stream), "cudaMemcpyAsync");
  synchronize("cudaMemcpyAsync (read to host)");
}

#endif

void* scratch_alloc(size_t bytes) {
  Context& c = context();
  const size_t need = round_up(std::max<size_t>(bytes, 1));
  ScratchMark& top = c.top;
  while (top.chunk < c.chunks.size()) {
    if (c.chunks[top.chunk].bytes - top.offset >= need) {
      void* p = c.chunks[top.chunk].base + top.offset;
      top.offset += need;
      return p;
    }
    ++top.chunk;
    top.offset = 0;
  }
  const size_t last = c.chunks.empty() ? 0 : c.chunks.back().bytes;
  const size_t chunk = std::max({need, kMinChunk, 2 * last});
  c.chunks.push_back({static_cast<char*>(device_alloc(chunk)), chunk});
  top.chunk = c.chunks.size() - 1;
  top.offset = need;
  return c.chunks.back().base;
}

ScratchMark scratch_mark() {
  return context().top;
}

void scratch_release(ScratchMark mark) {
  context().top = mark;
}

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
#if !defined(RLF_CUDA_EMULATION) && defined(RLFUSION_HAVE_CUBLAS)
  if (use_cublas()) {
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
    const cublasStatus_t status = cublas_functions()->sgemm(
        context().cublas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
        N, M, K, &alpha, B, ldb, A, lda, &beta, C, ldc);
    if (status != CUBLAS_STATUS_SUCCESS) {
      throw std::runtime_error("cuBLAS: cublasSgemm failed with status " +
                               std::to_string(int(status)));
    }
    return;
  }
#endif
  gemm_tiled(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace detail

namespace {
#if !defined(RLF_CUDA_EMULATION) && defined(RLFUSION_HAVE_CUBLAS)
bool g_use_cublas = true;
#else
bool g_use_cublas = false;
#endif
}  // namespace

#if defined(RLF_CUDA_EMULATION)
std::string kernel_image_error() {
  return "";
}
#else
namespace {
__global__ void probe_kernel() {}
}  // namespace

std::string kernel_image_error() {
  cudaFuncAttributes attributes{};
  const cudaError_t error = cudaFuncGetAttributes(&attributes, probe_kernel);
  if (error == cudaSuccess) return "";
  cudaGetLastError();
  return std::string(cudaGetErrorString(error)) + " (this build has machine code for " +
         RLFUSION_CUDA_ARCHITECTURES_TEXT + " only; set CMAKE_CUDA_ARCHITECTURES)";
}
#endif

bool cublas_available() {
#if !defined(RLF_CUDA_EMULATION) && defined(RLFUSION_HAVE_CUBLAS)
  return detail::cublas_functions() != nullptr;
#else
  return false;
#endif
}

void set_use_cublas(bool on) {
  g_use_cublas = on && cublas_available();
}

bool use_cublas() {
  // The first call opens libcublas (cublas_library.h); a build or machine without it uses the
  // tiled kernel.
  return g_use_cublas && cublas_available();
}

Workspace::Workspace(Arena& arena)
    : arena_(arena),
      arena_scratch_(arena.kind() == MemoryKind::CudaManaged),
      arena_mark_(arena.mark()),
      scratch_mark_(detail::scratch_mark()) {}

Workspace::~Workspace() {
#if !defined(RLF_CUDA_EMULATION)
  // Kernels may still use the scratch if an exception left an op early.
  cudaStreamSynchronize(detail::stream());
  cudaGetLastError();
#endif
  if (arena_scratch_) arena_.release(arena_mark_);
  detail::scratch_release(scratch_mark_);
}

void* Workspace::scratch_bytes(size_t bytes) {
  if (arena_scratch_) return arena_.allocate_bytes(std::max<size_t>(bytes, 1), "CUDA kernel work");
  return detail::scratch_alloc(bytes);
}

void* Workspace::stage(const void* p, size_t bytes, bool copy_in, bool copy_back) {
  if (!p) return nullptr;
  if (detail::device_accessible(p)) return const_cast<void*>(p);
  for (Staged& s : staged_) {
    if (s.host == p && s.bytes >= bytes) {
      s.copy_back = s.copy_back || copy_back;
      return s.device;
    }
  }
  void* device = detail::scratch_alloc(bytes);
  if (copy_in) detail::copy_async(device, p, bytes);
  staged_.push_back({p, device, bytes, copy_back});
  return device;
}

void Workspace::finish(const char* what) {
  detail::check_launch(what);
  for (const Staged& s : staged_) {
    if (s.copy_back) detail::copy_async(const_cast<void*>(s.host), s.device, s.bytes);
  }
  detail::synchronize(what);
  staged_.clear();
}

}  // namespace rlf::RLF_CUDA_NS
