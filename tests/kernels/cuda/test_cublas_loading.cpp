// cuBLAS is opened on first use, not at process start (kernels/cuda/cublas_library.h): a CPU run
// of a CUDA build must not pay for mapping libcublas and libcublasLt.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "kernels/gpu.h"

#if defined(RLFUSION_HAVE_CUDA)
#include "kernels/cuda/cuda_ops.h"
#endif

namespace rlf {
namespace {

bool library_mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::stringstream text;
  text << maps.rdbuf();
  return text.str().find(name) != std::string::npos;
}

// Evaluated before main, after the dynamic loader has mapped every linked library and before any
// test could have opened one.
const bool kCublasMappedAtStart = library_mapped("libcublas");

TEST(CublasLoading, NotMappedAtProcessStart) {
  if (!std::ifstream("/proc/self/maps")) GTEST_SKIP() << "no /proc/self/maps here";
  EXPECT_FALSE(kCublasMappedAtStart);
  // Choosing the CPU does not open it either.
  choose_device("cpu", Backend::Cpu);
  EXPECT_FALSE(library_mapped("libcublas"));
}

TEST(CublasLoading, OpenedWhenTheMatrixProductsAskForIt) {
#if defined(RLFUSION_HAVE_CUDA)
  if (!cuda::cublas_available()) GTEST_SKIP() << "this build or machine has no cuBLAS";
  EXPECT_TRUE(library_mapped("libcublas"));
  EXPECT_TRUE(cuda::use_cublas());
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

}  // namespace
}  // namespace rlf
