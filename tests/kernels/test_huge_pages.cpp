// Large host buffers advised to use transparent huge pages (kernels/huge_pages.h): placement and
// the advice itself, read back from the kernel's own record of the mapping.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/arena.h"
#include "kernels/huge_pages.h"

namespace rlf {
namespace {

// The VmFlags of the mapping holding `address` (/proc/self/smaps), "" when none is found.
std::string vm_flags_of(const void* address) {
  const auto at = reinterpret_cast<uintptr_t>(address);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream range(line);
    if (range >> std::hex >> begin >> dash >> end && dash == '-') {
      inside = begin <= at && at < end;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

bool transparent_huge_pages_available() {
  std::ifstream enabled("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes;
  std::getline(enabled, modes);
  return modes.find("[never]") == std::string::npos && !modes.empty();
}

TEST(HugePages, LargeBuffersAreAlignedAndAdvisedSmallOnesAreNot) {
  void* large = allocate_host_buffer(3 * kHugePageBytes + 5, 64);
  ASSERT_NE(large, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(large) % kHugePageBytes, 0u);
  std::memset(large, 7, 3 * kHugePageBytes + 5);  // every byte asked for is usable
  void* small = allocate_host_buffer(100, 256);
  ASSERT_NE(small, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small) % 256, 0u);
  if (transparent_huge_pages_available()) {
    // "hg": the mapping carries MADV_HUGEPAGE.
    EXPECT_NE(vm_flags_of(large).find(" hg"), std::string::npos) << vm_flags_of(large);
  }
  free_host_buffer(large);
  free_host_buffer(small);
}

TEST(HugePages, VectorsAndArenasUseThem) {
  std::vector<float, HugePageAllocator<float>> values(kHugePageBytes, 1.5f);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(values.data()) % kHugePageBytes, 0u);
  EXPECT_EQ(values.back(), 1.5f);
  Arena arena("huge", 64 << 20);
  float* first = arena.allocate<float>(16, "a block");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % kHugePageBytes, 0u);
  if (transparent_huge_pages_available()) {
    EXPECT_NE(vm_flags_of(values.data()).find(" hg"), std::string::npos);
    EXPECT_NE(vm_flags_of(first).find(" hg"), std::string::npos);
  }
}

}  // namespace
}  // namespace rlf
