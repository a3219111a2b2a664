#include "src/app/pipeline_ep_overlap_report.h"

#include <mpi.h>

#include <cstdio>
#include <vector>

namespace rlf {

std::string pipeline_ep_overlap_report(const SplitPhaseChain::Time& mine, int overlap_chunks,
                                       int pairs, RunDirectory& dir) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const double sent[3] = {mine.in_flight, mine.exposed, double(pairs)};
  std::vector<double> all(3 * size_t(world));
  MPI_Gather(sent, 3, MPI_DOUBLE, all.data(), 3, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  dir.log(
      "# PP x EP communication in the schedule, %d overlap chunk(s) per MoE layer (times under "
      "whatever load the machine had: counted, not a speed claim): in flight = dispatches and "
      "combines from begin to completion, exposed = the rank held up by them, hidden = 1 - "
      "exposed / in flight\n",
      overlap_chunks);
  std::string communication, exposed, hidden, paired;
  char number[48];
  for (int r = 0; r < world; ++r) {
    const SplitPhaseChain::Time t{all[3 * size_t(r)], all[3 * size_t(r) + 1]};
    const int rank_pairs = int(all[3 * size_t(r) + 2]);
    dir.log(
        "#   rank %d: in flight %.3f s, exposed %.3f s, hidden %.1f%%, %d forward / backward "
        "pairs\n",
        r, t.in_flight, t.exposed, 100 * hidden_fraction(t), rank_pairs);
    const char* comma = r ? "," : "";
    std::snprintf(number, sizeof number, "%s%d", comma, rank_pairs);
    paired += number;
    std::snprintf(number, sizeof number, "%s%.6e", comma, t.in_flight);
    communication += number;
    std::snprintf(number, sizeof number, "%s%.6e", comma, t.exposed);
    exposed += number;
    std::snprintf(number, sizeof number, "%s%.4f", comma, hidden_fraction(t));
    hidden += number;
  }
  return "\"ep_overlap_chunks\":" + std::to_string(overlap_chunks) + ",\"pipeline_pairs\":[" +
         paired + "],\"ep_communication_seconds\":[" + communication +
         "],\"ep_exposed_seconds\":[" + exposed + "],\"ep_hidden_fraction\":[" + hidden + "],";
}

}  // namespace rlf
