#include "src/app/ep_exchange_report.h"

#include <mpi.h>

#include <cstdio>
#include <vector>

namespace rlf {

std::string ep_exchange_report(const SplitPhaseChain::Time& mine, double rl_seconds,
                               RunDirectory& dir) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const double sent[3] = {mine.in_flight, mine.exposed, rl_seconds};
  std::vector<double> all(3 * size_t(world));
  MPI_Gather(sent, 3, MPI_DOUBLE, all.data(), 3, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  dir.log(
      "# EP exchanges (every MoE layer's dispatch and combine, forward and backward, generation "
      "and training; times under whatever load the machine had): in flight = from begin to "
      "completion, exposed = the rank held up by them\n");
  std::string in_flight, exposed;
  char number[48];
  for (int r = 0; r < world; ++r) {
    const double flight = all[3 * size_t(r)], held = all[3 * size_t(r) + 1];
    const double rl = all[3 * size_t(r) + 2];
    dir.log("#   rank %d: in flight %.3f s, exposed %.3f s (%.1f%% of its %.3f s of RL)\n", r,
            flight, held, rl > 0 ? 100 * held / rl : 0.0, rl);
    const char* comma = r ? "," : "";
    std::snprintf(number, sizeof number, "%s%.6e", comma, flight);
    in_flight += number;
    std::snprintf(number, sizeof number, "%s%.6e", comma, held);
    exposed += number;
  }
  return "\"ep_exchange_seconds\":[" + in_flight + "],\"ep_exchange_exposed_seconds\":[" + exposed +
         "],";
}

}  // namespace rlf
