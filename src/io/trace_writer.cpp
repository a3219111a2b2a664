#include "src/io/trace_writer.h"

#include <hdf5.h>

#include <cstdint>
#include <filesystem>
#include <limits>
#include <stdexcept>
#include <system_error>
#include <vector>

#include "src/io/trace_format.h"

namespace rlf {

namespace {

using trace_format::Handle;
using Metadata = std::map<std::string, std::string>;

void check(herr_t status, const std::string& what) {
  if (status < 0) throw std::runtime_error("HDF5: " + what + " failed");
}

// Attributes are written collectively under MPI-IO and must be identical on every rank: rank 0's
// map is the one written.
Metadata broadcast_metadata(const Metadata& local, MPI_Comm comm) {
  std::string packed;
  for (const auto& [key, value] : local) {
    packed += key;
    packed.push_back('\0');
    packed += value;
    packed.push_back('\0');
  }
  long long size = static_cast<long long>(packed.size());
  MPI_Bcast(&size, 1, MPI_LONG_LONG, 0, comm);
  packed.resize(size_t(size));
  MPI_Bcast(packed.data(), int(size), MPI_CHAR, 0, comm);
  Metadata metadata;
  for (size_t at = 0; at < packed.size();) {
    const size_t key_end = packed.find('\0', at);
    const size_t value_end = packed.find('\0', key_end + 1);
    metadata[packed.substr(at, key_end - at)] = packed.substr(key_end + 1, value_end - key_end - 1);
    at = value_end + 1;
  }
  return metadata;
}

void write_string_attribute(hid_t object, const std::string& name, const std::string& value) {
  Handle type{H5Tcopy(H5T_C_S1), H5Tclose};
  check(H5Tset_size(type.id, value.size() + 1), "sizing attribute " + name);
  Handle space{H5Screate(H5S_SCALAR), H5Sclose};
  Handle attr{H5Acreate2(object, name.c_str(), type.id, space.id, H5P_DEFAULT, H5P_DEFAULT),
              H5Aclose};
  check(H5Awrite(attr.id, type.id, value.c_str()), "writing attribute " + name);
}

void write_root_attributes(hid_t file, int world_size, const Metadata& metadata) {
  write_string_attribute(file, trace_format::kFormatAttribute, trace_format::kFormat);
  Handle space{H5Screate(H5S_SCALAR), H5Sclose};
  Handle attr{H5Acreate2(file, trace_format::kWorldSizeAttribute, H5T_STD_I64LE, space.id,
                         H5P_DEFAULT, H5P_DEFAULT),
              H5Aclose};
  const int64_t size = world_size;
  check(H5Awrite(attr.id, H5T_NATIVE_INT64, &size), "writing attribute world_size");
  for (const auto& [key, value] : metadata) write_string_attribute(file, key, value);
}

// One per-rank dataset kind (/rank_NNNNN/<name>): its element types and this rank's elements.
struct Table {
  const char* name;  // "events" | "samples" | "links" | "router_loads" | "migrations" | "routing"
  hid_t (*memory_type)();
  hid_t (*file_type)();
  size_t element_size;
  const void* data;               // this rank's elements
  std::vector<long long> counts;  // every rank's element count
};

std::string dataset_name(int rank, const Table& table) {
  return trace_format::rank_group(rank) + "/" + table.name;
}

void create_rank_group(hid_t file, int rank) {
  Handle group{H5Gcreate2(file, trace_format::rank_group(rank).c_str(), H5P_DEFAULT, H5P_DEFAULT,
                          H5P_DEFAULT),
               H5Gclose};
  check(group.id < 0 ? -1 : 0, "creating " + trace_format::rank_group(rank));
}

// Creates rank `rank`'s dataset of `table` with room for its count; returns the open dataset.
hid_t create_rank_dataset(hid_t file, int rank, const Table& table, hid_t file_type) {
  const hsize_t dims[1] = {hsize_t(table.counts[size_t(rank)])};
  Handle space{H5Screate_simple(1, dims, nullptr), H5Sclose};
  const std::string name = dataset_name(rank, table);
  const hid_t set =
      H5Dcreate2(file, name.c_str(), file_type, space.id, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  check(set < 0 ? -1 : 0, "creating " + name);
  return set;
}

void write_rows(hid_t set, const Table& table, const void* rows, int rank) {
  if (table.counts[size_t(rank)] == 0) return;
  Handle memory_type{table.memory_type(), H5Tclose};
  check(H5Dwrite(set, memory_type.id, H5S_ALL, H5S_ALL, H5P_DEFAULT, rows),
        "writing " + dataset_name(rank, table));
}

#ifdef H5_HAVE_PARALLEL
void write_parallel(const std::string& temporary, const std::vector<Table>& tables, MPI_Comm comm,
                    int rank, int world_size, const Metadata& metadata) {
  Handle access{H5Pcreate(H5P_FILE_ACCESS), H5Pclose};
  check(H5Pset_fapl_mpio(access.id, comm, MPI_INFO_NULL), "selecting MPI-IO");
  Handle file{H5Fcreate(temporary.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, access.id), H5Fclose};
  if (file.id < 0) throw std::runtime_error("cannot create '" + temporary + "'");
  write_root_attributes(file.id, world_size, metadata);
  for (int r = 0; r < world_size; ++r) create_rank_group(file.id, r);
  // Creating objects is collective: every rank creates every rank's datasets, in the same order;
  // the raw data is then written independently, each rank its own datasets.
  for (const Table& table : tables) {
    Handle file_type{table.file_type(), H5Tclose};
    Handle own{-1, H5Dclose};
    for (int r = 0; r < world_size; ++r) {
      const hid_t set = create_rank_dataset(file.id, r, table, file_type.id);
      if (r == rank) {
        own.id = set;
      } else {
        H5Dclose(set);
      }
    }
    write_rows(own.id, table, table.data, rank);
  }
}
#endif

// Every rank's rows of `table`, concatenated on rank 0 (empty elsewhere), and where each starts.
std::vector<std::byte> gather_rows(const Table& table, MPI_Comm comm, int rank,
                                   std::vector<long long>& first_row) {
  // Whole rows as one MPI type, so counts stay in int range up to 2^31 rows.
  MPI_Datatype row_type;
  MPI_Type_contiguous(int(table.element_size), MPI_BYTE, &row_type);
  MPI_Type_commit(&row_type);
  std::vector<int> receive_counts(table.counts.size()), displacements(table.counts.size());
  first_row.assign(table.counts.size(), 0);
  long long total = 0;
  for (size_t r = 0; r < table.counts.size(); ++r) {
    receive_counts[r] = int(table.counts[r]);
    displacements[r] = int(total);
    first_row[r] = total;
    total += table.counts[r];
  }
  if (total > std::numeric_limits<int>::max()) {
    MPI_Type_free(&row_type);
    throw std::runtime_error("trace too large to gather to rank 0 (" + std::to_string(total) +
                             " rows of " + table.name + "): use a parallel HDF5 library");
  }
  std::vector<std::byte> all(rank == 0 ? size_t(total) * table.element_size : 0);
  MPI_Gatherv(table.data, int(table.counts[size_t(rank)]), row_type, all.data(),
              receive_counts.data(), displacements.data(), row_type, 0, comm);
  MPI_Type_free(&row_type);
  return all;
}

void write_gathered(const std::string& temporary, const std::vector<Table>& tables, MPI_Comm comm,
                    int rank, int world_size, const Metadata& metadata) {
  std::vector<std::vector<std::byte>> gathered;
  std::vector<std::vector<long long>> first_rows(tables.size());
  for (size_t t = 0; t < tables.size(); ++t) {
    gathered.push_back(gather_rows(tables[t], comm, rank, first_rows[t]));
  }
  if (rank != 0) return;

  Handle file{H5Fcreate(temporary.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose};
  if (file.id < 0) throw std::runtime_error("cannot create '" + temporary + "'");
  write_root_attributes(file.id, world_size, metadata);
  for (int r = 0; r < world_size; ++r) create_rank_group(file.id, r);
  for (size_t t = 0; t < tables.size(); ++t) {
    Handle file_type{tables[t].file_type(), H5Tclose};
    for (int r = 0; r < world_size; ++r) {
      Handle set{create_rank_dataset(file.id, r, tables[t], file_type.id), H5Dclose};
      write_rows(set.id, tables[t],
                 gathered[t].data() + size_t(first_rows[t][size_t(r)]) * tables[t].element_size, r);
    }
  }
}

}  // namespace

bool parallel_hdf5_available() {
#ifdef H5_HAVE_PARALLEL
  return true;
#else
  return false;
#endif
}

void write_trace(const std::string& path, const TraceRecorder& recorder, MPI_Comm comm,
                 const std::map<std::string, std::string>& run_metadata, TraceWriteMode mode) {
  if (mode == TraceWriteMode::Parallel && !parallel_hdf5_available()) {
    throw std::invalid_argument("write_trace: this HDF5 library has no MPI-IO support");
  }
  const bool parallel = mode == TraceWriteMode::Parallel ||
                        (mode == TraceWriteMode::Auto && parallel_hdf5_available());
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const Metadata metadata = broadcast_metadata(run_metadata, comm);
  for (const char* reserved : {trace_format::kFormatAttribute, trace_format::kWorldSizeAttribute}) {
    if (metadata.count(reserved)) {
      throw std::invalid_argument(std::string("write_trace: metadata key '") + reserved +
                                  "' is reserved");
    }
  }
  std::vector<Table> tables = {{"events",
                                trace_format::create_event_memory_type,
                                trace_format::create_event_file_type,
                                sizeof(TraceEvent),
                                recorder.events().data(),
                                {}},
                               {"samples",
                                trace_format::create_sample_memory_type,
                                trace_format::create_sample_file_type,
                                sizeof(TrainedSample),
                                recorder.trained_samples().data(),
                                {}},
                               {"links",
                                trace_format::create_link_memory_type,
                                trace_format::create_link_file_type,
                                sizeof(LinkTraffic),
                                recorder.link_traffic().data(),
                                {}},
                               {"router_loads",
                                trace_format::create_router_load_memory_type,
                                trace_format::create_router_load_file_type,
                                sizeof(RouterLoad),
                                recorder.router_loads().data(),
                                {}},
                               {"migrations",
                                trace_format::create_migration_memory_type,
                                trace_format::create_migration_file_type,
                                sizeof(ExpertMigration),
                                recorder.migrations().data(),
                                {}},
                               {"routing",
                                trace_format::create_routing_memory_type,
                                trace_format::create_routing_file_type,
                                sizeof(int32_t),
                                recorder.routing().data(),
                                {}}};
  const long long own_counts[6] = {static_cast<long long>(recorder.events().size()),
                                   static_cast<long long>(recorder.trained_samples().size()),
                                   static_cast<long long>(recorder.link_traffic().size()),
                                   static_cast<long long>(recorder.router_loads().size()),
                                   static_cast<long long>(recorder.migrations().size()),
                                   static_cast<long long>(recorder.routing().size())};
  for (size_t t = 0; t < tables.size(); ++t) {
    tables[t].counts.assign(size_t(size), 0);
    MPI_Allgather(&own_counts[t], 1, MPI_LONG_LONG, tables[t].counts.data(), 1, MPI_LONG_LONG,
                  comm);
  }

  const std::string temporary = path + ".tmp";
  std::string error;
  try {
#ifdef H5_HAVE_PARALLEL
    if (parallel) {
      write_parallel(temporary, tables, comm, rank, size, metadata);
    } else {
      write_gathered(temporary, tables, comm, rank, size, metadata);
    }
#else
    (void)parallel;
    write_gathered(temporary, tables, comm, rank, size, metadata);
#endif
  } catch (const std::exception& e) {
    error = e.what();
  }
  // Also the point after which every rank has closed the file, so rank 0 may rename it.
  int failed = error.empty() ? 0 : 1, any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, comm);
  if (any_failed == 0 && rank == 0) {
    std::error_code code;
    std::filesystem::rename(temporary, path, code);
    if (code) {
      error = "cannot rename '" + temporary + "' to '" + path + "': " + code.message();
      any_failed = 1;
    }
  }
  MPI_Bcast(&any_failed, 1, MPI_INT, 0, comm);
  if (any_failed) {
    throw std::runtime_error("writing trace '" + path +
                             "': " + (error.empty() ? "failed on another rank" : error));
  }
}

}  // namespace rlf
