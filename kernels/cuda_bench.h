// `rlfusion bench kernels --device cuda` (and the standalone rlfusion-kernels-bench of the
// kernels-only build): every CUDA op timed on device-resident data at a realistic size, as
// GFLOP/s or GB/s and as a percentage of the device's measured peaks (a large fp32 GEMM and a
// device-to-device copy measured in the same run), each checked against the reference.
#pragma once

#include <string>

namespace rlf {

struct CudaBenchOptions {
  int repeats = 5;     // timed calls per op (median reported), after one warm-up call
  bool quick = false;  // smaller peak GEMM and copy (a smoke run)
  bool json = false;   // also one JSON line
};

// Prints the table; returns the number of ops whose check against the reference failed. Throws
// ConfigError when no GPU is usable (the CUDA runtime's reason) or the build has no CUDA.
int run_cuda_kernel_bench(const CudaBenchOptions& options, const std::string& header);

}  // namespace rlf
