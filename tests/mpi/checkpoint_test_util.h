// Helpers of the MPI checkpoint tests: a model whose experts divide among every rank count the
// MPI tests run at, and a run directory the world shares.
#pragma once

#include <mpi.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "src/model/model_config.h"
#include "tests/micro_model_config.h"
#include "tests/mpi/mpi_test_util.h"

namespace rlf::test {

inline ModelConfig twelve_experts() {
  ModelConfig c = micro_config();
  c.n_experts = 12;  // divisible by every rank count the MPI tests run at (1, 2, 4, 6)
  c.validate("test");
  return c;
}

// A run directory shared by the world (rank 0's name, unique per test process and `prefix`),
// emptied.
inline std::string shared_run_dir(const std::string& prefix) {
  namespace fs = std::filesystem;
  char name[256] = {};
  if (world_rank() == 0) {
    const std::string dir =
        (fs::temp_directory_path() / (prefix + "-" + std::to_string(getpid()))).string();
    fs::remove_all(dir);
    dir.copy(name, sizeof name - 1);
  }
  MPI_Bcast(name, sizeof name, MPI_CHAR, 0, MPI_COMM_WORLD);
  return name;
}

}  // namespace rlf::test
