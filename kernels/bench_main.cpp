// rlfusion-kernels-bench: `rlfusion bench kernels --device cuda` as a program of its own, for the
// kernels-only build of a GPU machine (no MPI, HDF5, Boost). Options: --repeats N, --quick,
// --json. Exit codes: 0 all checks passed, 1 a kernel disagreed with the reference, 2 bad
// input or no usable GPU (with the CUDA runtime's reason).
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "kernels/cuda_bench.h"
#include "kernels/error.h"

int main(int argc, char** argv) {
  rlf::CudaBenchOptions options;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "--repeats" && i + 1 < argc) {
        options.repeats = std::atoi(argv[++i]);
      } else if (arg == "--quick") {
        options.quick = true;
      } else if (arg == "--json") {
        options.json = true;
      } else {
        throw rlf::ConfigError("unknown option '" + arg +
                               "' (rlfusion-kernels-bench [--repeats N] [--quick] [--json])");
      }
    }
    return rlf::run_cuda_kernel_bench(options, "rlfusion-kernels-bench (kernels-only build)") ? 1
                                                                                              : 0;
  } catch (const rlf::ConfigError& e) {
    std::fprintf(stderr, "rlfusion-kernels-bench: error: %s\n", e.what());
    return rlf::kExitConfigError;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rlfusion-kernels-bench: fatal: %s\n", e.what());
    return 1;
  }
}
