// Reads a trace.h5 written by write_trace (layout: trace_format.h) back into memory, for
// `rlfusion report` and tests. Serial: one process opens the file read-only.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "src/io/trace.h"

namespace rlf {

struct TraceData {
  int world_size = 0;
  std::map<std::string, std::string> metadata;  // the run metadata (string root attributes)
  std::vector<std::vector<TraceEvent>> ranks;   // ranks[r]: rank r's events, in recorded order
  // samples[r]: the samples rank r trained, in order (empty for traces older than StaleSync).
  std::vector<std::vector<TrainedSample>> samples;

  size_t event_count() const;
};

// Throws ConfigError naming `path` when the file is missing, is not HDF5, is damaged, or is not a
// complete rlfusion trace (format attribute, world_size, every rank's events).
TraceData read_trace(const std::string& path);

}  // namespace rlf
