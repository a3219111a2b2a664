// Writes every rank's trace events into one trace.h5 (layout: trace_format.h). The file is written
// under a temporary name (`path`.tmp) and renamed by rank 0 once closed, so a run killed while
// writing never leaves a half-written file under the final name.
#pragma once

#include <mpi.h>

#include <map>
#include <string>

#include "src/io/trace.h"

namespace rlf {

enum class TraceWriteMode {
  Auto,          // Parallel when the HDF5 library has MPI-IO support, else GatherToRoot
  Parallel,      // every rank writes its own dataset through MPI-IO (H5Pset_fapl_mpio)
  GatherToRoot,  // events gathered to rank 0 (MPI_Gatherv), which writes the file alone
};

// True when the HDF5 library was built with MPI-IO (H5_HAVE_PARALLEL).
bool parallel_hdf5_available();

// Collective over `comm`: every rank passes its own recorder; rank r's events land in
// /rank_{r:05d}/events, its trained samples in /rank_{r:05d}/samples and its link
// traffic in /rank_{r:05d}/links. `run_metadata` becomes
// string attributes of the root group; rank 0's map is used (broadcast), so ranks need not agree on
// it. Keys "format" and "world_size" are reserved. Returns on every rank once the file is in place
// under `path`; throws std::runtime_error on every rank when it could not be written. Requesting
// Parallel from a serial HDF5 library throws std::invalid_argument.
void write_trace(const std::string& path, const TraceRecorder& recorder, MPI_Comm comm,
                 const std::map<std::string, std::string>& run_metadata,
                 TraceWriteMode mode = TraceWriteMode::Auto);

}  // namespace rlf
