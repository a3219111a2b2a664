// Device selection (--device cpu | cuda | auto) and CUDA memory: the paths a machine without a GPU
// takes are tested everywhere; the GPU paths where a GPU is usable.
#include <gtest/gtest.h>

#include <string>

#include "kernels/arena.h"
#include "kernels/error.h"
#include "kernels/gpu.h"
#include "kernels/ops.h"

#if defined(RLFUSION_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace rlf {
namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(CudaDevice, CpuIsAlwaysTheCpu) {
  std::string note = "untouched";
  EXPECT_EQ(choose_device("cpu", Backend::Cpu, &note), Backend::Cpu);
  EXPECT_EQ(choose_device("cpu", Backend::Reference), Backend::Reference);
  EXPECT_EQ(note, "untouched");
}

TEST(CudaDevice, UnknownDeviceIsAConfigError) {
  try {
    choose_device("gpu", Backend::Cpu);
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(contains(e.what(), "--device must be 'cpu', 'cuda' or 'auto'")) << e.what();
  }
}

TEST(CudaDevice, CudaWithoutAUsableGpuIsOneClearError) {
  std::string reason;
  if (cuda_usable(&reason)) {
    EXPECT_EQ(choose_device("cuda", Backend::Cpu), Backend::Cuda);
    EXPECT_THROW(choose_device("cuda", Backend::Reference), ConfigError);
    GTEST_SKIP() << "a CUDA GPU is usable here: " << cuda_device_description();
  }
  ASSERT_FALSE(reason.empty());
  try {
    choose_device("cuda", Backend::Cpu);
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    if (built_with_cuda()) {
      // The CUDA runtime's own words, e.g. "CUDA driver version is insufficient for CUDA runtime
      // version (cudaErrorInsufficientDriver)" or "no CUDA-capable device is detected".
      EXPECT_TRUE(contains(what, "--device cuda: no usable CUDA GPU: " + reason)) << what;
      EXPECT_TRUE(contains(what, "cuda") || contains(what, "CUDA")) << what;
    } else {
      EXPECT_TRUE(contains(what, "built without CUDA")) << what;
    }
  }
}

TEST(CudaDevice, AutoFallsBackToTheCpuAndSaysWhy) {
  std::string reason, note;
  const Backend chosen = choose_device("auto", Backend::Cpu, &note);
  if (cuda_usable(&reason)) {
    EXPECT_EQ(chosen, Backend::Cuda);
    EXPECT_TRUE(contains(note, "CUDA kernels on")) << note;
    return;
  }
  EXPECT_EQ(chosen, Backend::Cpu);
  EXPECT_TRUE(contains(note, "--device auto: no usable CUDA GPU (" + reason + ")")) << note;
  EXPECT_TRUE(contains(note, "running on the CPU (cpu kernels)")) << note;
  EXPECT_EQ(choose_device("auto", Backend::Reference), Backend::Reference);
}

TEST(CudaDevice, CudaMemoryWithoutAUsableGpuIsAConfigError) {
  if (cuda_usable()) GTEST_SKIP() << "a CUDA GPU is usable here";
  EXPECT_THROW(Arena("device", 1 << 20, MemoryKind::CudaManaged), ConfigError);
  EXPECT_THROW(Arena("offload", 1 << 20, MemoryKind::CudaPinned), ConfigError);
  if (!built_with_cuda()) {
    EXPECT_THROW(cuda_ops(), ConfigError);
  }
  EXPECT_EQ(cuda_device_description(), "");
}

TEST(CudaDevice, ManagedArenaIsUsableFromTheHost) {
  std::string reason;
  if (!cuda_usable(&reason)) GTEST_SKIP() << "no usable CUDA GPU: " << reason;
  Arena device("device", size_t(64) << 20, MemoryKind::CudaManaged);
  Arena pinned("pinned", size_t(1) << 20, MemoryKind::CudaPinned);
  float* a = device.allocate_zeroed<float>(1000, "a");
  float* b = pinned.allocate<float>(1000, "b");
  for (int i = 0; i < 1000; ++i) a[i] = float(i);
  copy_bytes(b, a, 1000 * sizeof(float));
  EXPECT_EQ(b[999], 999.0f);
  EXPECT_EQ(device.kind(), MemoryKind::CudaManaged);
  // Zeroed on the GPU (cudaMemset), read on the host: the same memory over written values.
  const Arena::Mark mark = device.mark();
  float* used = device.allocate<float>(5000, "used");
  for (int i = 0; i < 5000; ++i) used[i] = 1.0f + float(i);
  device.release(mark);
  const float* zeroed = device.allocate_zeroed<float>(5000, "zeroed");
  ASSERT_EQ(zeroed, used);
  for (int i = 0; i < 5000; ++i) ASSERT_EQ(zeroed[i], 0.0f) << i;
  size_t free_bytes = 0, total = 0;
  cuda_memory_info(&free_bytes, &total);
  EXPECT_THROW(Arena("too big", total + (size_t(1) << 30), MemoryKind::CudaManaged),
               OutOfDeviceMemory);
}

TEST(CudaDevice, CopyBytesBetweenDeviceBuffersIsDoneWhenItReturns) {
  // cudaMemcpy returns before a device-to-device copy is done, and the kernels run on a
  // non-blocking stream that would not wait for it (the kernels bench once timed a 2 GiB copy
  // at 0.009 ms). A 1 GiB copy takes ~0.5 ms on an H200: far longer than a return and a query.
  std::string reason;
  if (!cuda_usable(&reason)) GTEST_SKIP() << "no usable CUDA GPU: " << reason;
#if defined(RLFUSION_HAVE_CUDA)
  const size_t bytes = size_t(1) << 30;
  void* src = cuda_alloc_device(bytes, "copy source");
  void* dst = cuda_alloc_device(bytes, "copy destination");
  ASSERT_EQ(cudaMemset(src, 7, bytes), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  copy_bytes(dst, src, bytes);
  EXPECT_EQ(cudaStreamQuery(cudaStreamLegacy), cudaSuccess) << "the copy is still running";
  unsigned char last = 0;
  copy_bytes(&last, static_cast<unsigned char*>(dst) + bytes - 1, 1);
  EXPECT_EQ(last, 7);
  cuda_free_device(dst);
  cuda_free_device(src);
#endif
}

TEST(CudaDevice, CopyBytesIsMemcpyOnHostMemory) {
  const char src[] = "host to host";
  char dst[sizeof src] = {};
  copy_bytes(dst, src, sizeof src);
  EXPECT_STREQ(dst, src);
}

}  // namespace
}  // namespace rlf
