// cuBLAS opened with dlopen on first use instead of linked. libcublas and its libcublasLt (about
// 600 MB) take ~0.45 s to map and relocate, and a linked library is paid by every process at
// start-up: every CPU-only run, every test and every MPI rank of a CUDA build. Opened lazily, only
// a run that multiplies matrices on a GPU pays it.
#pragma once

#include <cublas_v2.h>

#include <string>

namespace rlf::cuda::detail {

// The four cuBLAS entry points the backend calls (types from cublas_v2.h, so a signature change in
// a new toolkit fails to compile here rather than at run time).
struct CublasFunctions {
  decltype(&cublasCreate) create = nullptr;
  decltype(&cublasSetStream) set_stream = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  decltype(&cublasSgemm) sgemm = nullptr;
};

// Loads libcublas on the first call (thread-safe) and returns its functions, or nullptr when it
// cannot be opened; then cublas_load_error() says why (dlerror's text).
const CublasFunctions* cublas_functions();
std::string cublas_load_error();

}  // namespace rlf::cuda::detail
