// --device cpu | cuda | auto on the real binary. Without a usable GPU (this CI machine):
// --device cuda is one clear error naming the CUDA runtime's reason (or a build without CUDA),
// exit code 2 before any work; --device auto runs on the CPU and says so.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "kernels/error.h"
#include "kernels/gpu.h"
#include "tests/app/run_rlfusion.h"

namespace rlf {
namespace {

using test::run_rlfusion;

std::string temp_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("rlfusion-test-" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

const std::string kSft = "sft --model tiny --task add --threads 1 --steps 2 --eval-prompts 4 ";

TEST(DeviceOption, CudaWithoutAUsableGpuIsOneErrorBeforeAnyWork) {
  std::string reason;
  if (cuda_usable(&reason)) GTEST_SKIP() << "a CUDA GPU is usable here";
  const std::string dir = temp_dir("device-cuda");
  for (const std::string& command :
       {kSft + "--device cuda --run-dir " + dir + "/run",
        std::string("bench kernels --device cuda"),
        "train --model tiny --device cuda --run-dir " + dir + "/train"}) {
    const auto r = run_rlfusion(command);
    EXPECT_EQ(r.exit_code, kExitConfigError) << command << "\n" << r.output;
    EXPECT_EQ(count(r.output, "rlfusion: error:"), 1u) << r.output;
    if (built_with_cuda()) {
      EXPECT_NE(r.output.find("rlfusion: error: --device cuda: no usable CUDA GPU: " + reason),
                std::string::npos)
          << r.output;
    } else {
      EXPECT_NE(r.output.find("built without CUDA"), std::string::npos) << r.output;
    }
  }
  EXPECT_FALSE(std::filesystem::exists(dir + "/run"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/train"));
}

TEST(DeviceOption, AutoFallsBackToTheCpuAndSaysSo) {
  const std::string dir = temp_dir("device-auto");
  const auto r = run_rlfusion(kSft + "--device auto --run-dir " + dir + "/run");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string reason;
  if (cuda_usable(&reason)) {
    EXPECT_NE(r.output.find("--device auto: CUDA kernels on"), std::string::npos) << r.output;
    return;
  }
  EXPECT_NE(r.output.find("rlfusion: --device auto: no usable CUDA GPU (" + reason +
                          "); running on the CPU (cpu kernels)"),
            std::string::npos)
      << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir + "/run/model.h5"));
}

TEST(DeviceOption, UnknownDeviceIsRejected) {
  const auto r = run_rlfusion(kSft + "--device tpu");
  EXPECT_EQ(r.exit_code, kExitConfigError) << r.output;
  EXPECT_NE(r.output.find("--device must be 'cpu', 'cuda' or 'auto', got 'tpu'"), std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace rlf
