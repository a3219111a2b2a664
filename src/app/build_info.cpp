#include "src/app/build_info.h"

#include <hdf5.h>
#include <mpi.h>

#include <string>

namespace rlf {

std::string build_info() {
  std::string info = "rlfusion 0.1.0, C++ " + std::to_string(__cplusplus);
#if defined(__VERSION__)
  info += ", compiler " + std::string(__VERSION__);
#endif
#if defined(__AVX2__)
  info += ", AVX2";
#endif
#if defined(__FMA__)
  info += "+FMA";
#endif
  info += ", HDF5 " + std::to_string(H5_VERS_MAJOR) + "." + std::to_string(H5_VERS_MINOR) + "." +
          std::to_string(H5_VERS_RELEASE);
#if defined(H5_HAVE_PARALLEL)
  info += " (parallel)";
#else
  info += " (serial)";
#endif
  info += ", MPI " + std::to_string(MPI_VERSION) + "." + std::to_string(MPI_SUBVERSION);
#if defined(RLFUSION_HAVE_CUDA)
  info += ", CUDA " + std::string(RLFUSION_CUDA_VERSION_TEXT) + " (" +
          RLFUSION_CUDA_ARCHITECTURES_TEXT + ")";
#else
  info += ", no CUDA";
#endif
  return info;
}

}  // namespace rlf
