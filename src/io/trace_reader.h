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
  // links[r]: rank r's traffic per link class (empty for older traces and one-rank runs).
  std::vector<std::vector<LinkTraffic>> links;
  // router_loads[r], migrations[r]: rank r's (empty for older traces and runs without them).
  std::vector<std::vector<RouterLoad>> router_loads;
  std::vector<std::vector<ExpertMigration>> migrations;
  // routing[r]: rank r's routing log (mpi_comm/routing_log.h; empty without --trace-routing).
  std::vector<std::vector<int32_t>> routing;

  size_t event_count() const;
};

// Throws ConfigError naming `path` when the file is missing, is not HDF5, is damaged, is not a
// complete rlfusion trace (format attribute, world_size, every rank's events), or holds values no
// run records (trace_value_error).
TraceData read_trace(const std::string& path);

// What no run records, so what a damaged or foreign file would make the report compute from: a
// phase or link class out of range, a time that is not finite, an event that ends before it
// begins, negative counts, a sample whose versions are out of order. "" when every value is
// possible; otherwise what is wrong and where ("rank 2 event 17: ..."). The report's arithmetic
// (summarize, the timeline) is defined for every trace that passes (tests/fuzz).
std::string trace_value_error(const TraceData& trace);

}  // namespace rlf
