#include "src/app/expert_rows_report.h"

#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <vector>

namespace rlf {

std::string expert_rows_report(int64_t rows_here, const TensorParallel* tp, bool token_split,
                               RunDirectory& dir) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  long long mine = rows_here;
  std::vector<long long> all(size_t(world), 0);
  MPI_Gather(&mine, 1, MPI_LONG_LONG, all.data(), 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
  std::string rows, listed;
  for (int r = 0; r < world; ++r) {
    if (r > 0) {
      rows += ',';
      listed += ' ';
    }
    rows += std::to_string(all[size_t(r)]);
    listed += std::to_string(all[size_t(r)]);
  }
  std::string json = "\"expert_rows_per_rank\":[" + rows + "],";
  if (!tp) {
    dir.log("# expert rows computed per rank (every forward's routed rows): %s\n", listed.c_str());
    return json;
  }
  const TensorParallelCounters& c = tp->counters();
  dir.log(
      "# expert rows computed per rank (every forward's routed rows): %s; %s; rank 0 ran %lld "
      "TP allgathers of MoE rows (%lld elements assembled)\n",
      listed.c_str(),
      token_split ? "token split: each TP rank computes its share of its group's tokens"
                  : "duplicated: every TP rank computes all of its group's tokens",
      (long long)c.allgathers, (long long)c.allgathered_elements);
  return json + "\"tensor_expert_split\":" + (token_split ? "true" : "false") +
         ",\"tp_allgathers\":" + std::to_string(c.allgathers) +
         ",\"tp_allgathered_elements\":" + std::to_string(c.allgathered_elements) + ",";
}

double touched_experts_per_call(Transformer<float>& model) {
  const Transformer<float>::TouchedExperts mine = model.take_touched_experts();
  long long counts[2] = {(long long)mine.calls, (long long)mine.touched};
  MPI_Allreduce(MPI_IN_PLACE, counts, 2, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  return counts[0] > 0 ? double(counts[1]) / double(counts[0]) : 0.0;
}

std::string touched_experts_json(double per_call) {
  if (per_call <= 0) return "";
  char json[64];
  std::snprintf(json, sizeof json, "\"active_experts_per_call\":%.4f,", per_call);
  return json;
}

void add_touched_experts(std::map<std::string, std::string>& metadata, double per_call) {
  if (per_call <= 0) return;
  char value[32];
  std::snprintf(value, sizeof value, "%.4f", per_call);
  metadata["active_experts_per_call"] = value;
}

}  // namespace rlf
