// The layout of trace.h5, shared by the writer and the reader:
//   /                      attributes: format = "rlfusion-trace-1", world_size (int64), and one
//                          string attribute per run-metadata key (command, mode, model, ...)
//   /rank_NNNNN/events     1-D compound dataset, one element per TraceEvent of rank NNNNN:
//                          phase (HDF5 enum over int32 carrying the phase names), begin, end
//                          (float64 seconds since the shared epoch), tokens, bytes (int64),
//                          version (int32, -1: none), memory_bytes (int64)
//   /rank_NNNNN/samples    1-D compound dataset, one element per TrainedSample of rank NNNNN:
//                          sample_id (int64), version_min, version_max, trained_version,
//                          prompt_tokens, response_tokens (int32; the last two absent in older
//                          traces, read as -1). Absent in traces written before StaleSync (read
//                          as none).
//   /rank_NNNNN/links      1-D compound dataset, one element per link class the rank counted:
//                          link_class (int32: 0 intra-node, 1 inter-node), bytes, messages
//                          (int64, sent by the rank over the run). Absent in older traces and in
//                          runs without a topology (one-rank `train`, `sft`): read as none.
//   /rank_NNNNN/router_loads  1-D compound dataset, one element per RouterLoad (step, layer,
//                          expert: int32; tokens: int64). Only expert-parallel learners of
//                          `train` record them; absent in older traces.
//   /rank_NNNNN/migrations 1-D compound dataset, one element per ExpertMigration (step,
//                          experts_moved: int32; bytes: int64; predicted_gain_seconds,
//                          cost_seconds, max_mean_before, max_mean_after: float64). Absent in
//                          older traces and runs without `--rebalance-every`.
//   /rank_NNNNN/routing    1-D int32 dataset: the rank's routing log (mpi_comm/routing_log.h),
//                          the expert dispatchers' inputs in order. Only `train --trace-routing`
//                          records it; absent otherwise (read as none).
// Internal to src/io.
#pragma once

#include <hdf5.h>

#include <string>

namespace rlf::trace_format {

inline constexpr const char* kFormat = "rlfusion-trace-1";
inline constexpr const char* kFormatAttribute = "format";
inline constexpr const char* kWorldSizeAttribute = "world_size";

// "/rank_00003/events" and its group "/rank_00003".
std::string rank_group(int rank);
std::string rank_events(int rank);
std::string rank_samples(int rank);
std::string rank_links(int rank);
std::string rank_router_loads(int rank);
std::string rank_migrations(int rank);
std::string rank_routing(int rank);

// Closes an HDF5 handle on scope exit.
struct Handle {
  hid_t id;
  herr_t (*close)(hid_t);
  Handle(hid_t id_, herr_t (*close_)(hid_t)) : id(id_), close(close_) {}
  ~Handle() {
    if (id >= 0) close(id);
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
};

// The TraceEvent compound (its phase member an HDF5 enum over int32 carrying the phase names): in
// memory (native layout of the struct) and in the file (packed, little-endian), so files read the
// same on every machine.
hid_t create_event_memory_type();
hid_t create_event_file_type();
// The TrainedSample compound, likewise.
hid_t create_sample_memory_type();
hid_t create_sample_file_type();
// The LinkTraffic compound, likewise.
hid_t create_link_memory_type();
hid_t create_link_file_type();
// The RouterLoad and ExpertMigration compounds, likewise.
hid_t create_router_load_memory_type();
hid_t create_router_load_file_type();
hid_t create_migration_memory_type();
hid_t create_migration_file_type();
// The routing log's values: int32, native in memory, little-endian in the file.
hid_t create_routing_memory_type();
hid_t create_routing_file_type();

}  // namespace rlf::trace_format
