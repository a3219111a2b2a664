#include "src/runtime/expert_aligned_tensor_groups.h"

#include "kernels/error.h"

namespace rlf {

std::string expert_aligned_tensor_problem(int ranks, int degree, int expert_parallel) {
  const int run = degree * expert_parallel;
  if (degree < 1 || expert_parallel < 1 || ranks % run == 0) return "";
  return "TP " + std::to_string(degree) + " x EP " + std::to_string(expert_parallel) + " = " +
         std::to_string(run) + " must divide the " + std::to_string(ranks) +
         " ranks (each generation TP group takes the ranks holding one expert block in " +
         std::to_string(run) + " consecutive ranks)";
}

int expert_aligned_tensor_position(int rank, int degree, int expert_parallel) {
  const int run = degree * expert_parallel;
  const int in_run = rank % run;
  const int block = in_run % expert_parallel;  // the training EP rank: which experts it holds
  const int place = in_run / expert_parallel;  // its TP rank in the group of that block
  return rank - in_run + block * degree + place;
}

std::unique_ptr<TensorParallel> make_expert_aligned_tensor_parallel(MPI_Comm comm, int degree,
                                                                    int expert_parallel,
                                                                    bool attention_only,
                                                                    const ModelConfig& config,
                                                                    Links& links) {
  int rank = 0, size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const std::string problem = expert_aligned_tensor_problem(size, degree, expert_parallel);
  if (!problem.empty()) throw ConfigError(problem);
  // TensorParallel takes consecutive ranks of the communicator it is given: order them first.
  MPI_Comm ordered = MPI_COMM_NULL;
  MPI_Comm_split(comm, 0, expert_aligned_tensor_position(rank, degree, expert_parallel), &ordered);
  std::unique_ptr<TensorParallel> tp;
  try {
    tp = std::make_unique<TensorParallel>(ordered, degree, attention_only, config, links);
  } catch (...) {
    MPI_Comm_free(&ordered);
    throw;
  }
  MPI_Comm_free(&ordered);  // (the groups are split from it: it is not needed afterwards)
  return tp;
}

}  // namespace rlf
