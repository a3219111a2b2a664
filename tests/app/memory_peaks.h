// A fused run's device memory peaks as summary.json (printed at the end) reports them.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "tests/app/json_output.h"

namespace rlf::test {

// Rank 0's measured generation peak and the one the fit check counted (its analytic peak), in
// bytes (NaN when the output has no "device_memory_peaks").
struct GenerationPeaks {
  double measured, counted;
};

inline GenerationPeaks generation_peaks(const std::string& output) {
  const size_t peaks = output.find("\"device_memory_peaks\"");
  if (peaks == std::string::npos) return {std::nan(""), std::nan("")};
  return {json_number(output, "generation", peaks),
          json_number(output, "generation_analytic", peaks)};
}

// The fit check's generation peak bounds the measured one from above, and the measured one is at
// least `lowest_share` of it (the count is not loose).
inline void expect_generation_peak_counted(const std::string& output, double lowest_share) {
  const GenerationPeaks peaks = generation_peaks(output);
  ASSERT_FALSE(std::isnan(peaks.measured) || std::isnan(peaks.counted)) << output;
  EXPECT_LE(peaks.measured, peaks.counted) << output;
  EXPECT_GE(peaks.measured, lowest_share * peaks.counted) << output;
}

}  // namespace rlf::test
