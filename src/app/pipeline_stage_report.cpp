#include "src/app/pipeline_stage_report.h"

#include <cstdio>
#include <vector>

#include "src/balance/stage_balance.h"

namespace rlf {

std::string pipeline_stage_report(const PipelineGroups& groups, const std::string& balance,
                                  double compute_seconds, double wall_seconds, RunDirectory& dir) {
  const HierarchicalComm& pipeline = groups.pipeline();
  std::vector<double> stages(size_t(pipeline.size()));
  MPI_Allgather(&compute_seconds, 1, MPI_DOUBLE, stages.data(), 1, MPI_DOUBLE, pipeline.comm);
  const std::string layers = layers_per_chunk(groups.boundaries());
  std::string seconds;
  for (size_t s = 0; s < stages.size(); ++s) {
    char field[32];
    std::snprintf(field, sizeof field, "%s%.4f", s ? "," : "", stages[s]);
    seconds += field;
  }
  dir.log(
      "# pipeline stages (--pipeline-balance %s): layers per chunk %s; compute seconds by "
      "stage %s\n",
      balance.c_str(), layers.c_str(), seconds.c_str());
  char wall[64];
  std::snprintf(wall, sizeof wall, "\"pipeline_steps_wall_seconds\":%.4f,", wall_seconds);
  return "\"pipeline_balance\":\"" + balance + "\",\"pipeline_layers_per_chunk\":[" + layers +
         "],\"pipeline_stage_compute_seconds\":[" + seconds + "]," + wall;
}

}  // namespace rlf
