#include "src/io/trace_format.h"

#include <cstddef>
#include <cstdio>
#include <stdexcept>
#include <vector>

#include "src/io/trace.h"

namespace rlf::trace_format {

std::string rank_group(int rank) {
  char name[32];
  std::snprintf(name, sizeof name, "/rank_%05d", rank);
  return name;
}

std::string rank_events(int rank) {
  return rank_group(rank) + "/events";
}

std::string rank_samples(int rank) {
  return rank_group(rank) + "/samples";
}

std::string rank_links(int rank) {
  return rank_group(rank) + "/links";
}

std::string rank_router_loads(int rank) {
  return rank_group(rank) + "/router_loads";
}

std::string rank_migrations(int rank) {
  return rank_group(rank) + "/migrations";
}

std::string rank_routing(int rank) {
  return rank_group(rank) + "/routing";
}

namespace {

void check(herr_t status, const char* what) {
  if (status < 0) throw std::runtime_error(std::string("HDF5: ") + what + " failed");
}

hid_t create_phase_type(hid_t base) {
  const hid_t type = H5Tenum_create(base);
  for (int p = 0; p < kPhaseCount; ++p) {
    const int32_t value = p;
    check(H5Tenum_insert(type, phase_name(Phase(p)), &value), "inserting a phase name");
  }
  return type;
}

struct Member {
  const char* name;
  hid_t type;
  size_t offset;
};

// A compound of `members`: `file` packs them in order, the memory type follows the struct's
// own offsets and size.
hid_t create_compound(const std::vector<Member>& members, bool file, size_t struct_size) {
  size_t packed_size = 0;
  for (const Member& m : members) packed_size += H5Tget_size(m.type);
  const hid_t type = H5Tcreate(H5T_COMPOUND, file ? packed_size : struct_size);
  size_t packed_offset = 0;
  for (const Member& m : members) {
    check(H5Tinsert(type, m.name, file ? packed_offset : m.offset, m.type), "building the type");
    packed_offset += H5Tget_size(m.type);
  }
  return type;
}

// Members in TraceEvent order; `file` packs them with little-endian types.
hid_t create_event_type(bool file) {
  static_assert(sizeof(Phase) == sizeof(int32_t));
  const hid_t f64 = file ? H5T_IEEE_F64LE : H5T_NATIVE_DOUBLE;
  const hid_t i64 = file ? H5T_STD_I64LE : H5T_NATIVE_INT64;
  const hid_t i32 = file ? H5T_STD_I32LE : H5T_NATIVE_INT32;
  Handle phase{create_phase_type(i32), H5Tclose};
  const std::vector<Member> members = {
      {"phase", phase.id, offsetof(TraceEvent, phase)},
      {"begin", f64, offsetof(TraceEvent, begin)},
      {"end", f64, offsetof(TraceEvent, end)},
      {"tokens", i64, offsetof(TraceEvent, tokens)},
      {"bytes", i64, offsetof(TraceEvent, bytes)},
      {"version", i32, offsetof(TraceEvent, version)},
      {"memory_bytes", i64, offsetof(TraceEvent, memory_bytes)},
  };
  return create_compound(members, file, sizeof(TraceEvent));
}

hid_t create_sample_type(bool file) {
  const hid_t i64 = file ? H5T_STD_I64LE : H5T_NATIVE_INT64;
  const hid_t i32 = file ? H5T_STD_I32LE : H5T_NATIVE_INT32;
  return create_compound({{"sample_id", i64, offsetof(TrainedSample, sample_id)},
                          {"version_min", i32, offsetof(TrainedSample, version_min)},
                          {"version_max", i32, offsetof(TrainedSample, version_max)},
                          {"trained_version", i32, offsetof(TrainedSample, trained_version)},
                          {"prompt_tokens", i32, offsetof(TrainedSample, prompt_tokens)},
                          {"response_tokens", i32, offsetof(TrainedSample, response_tokens)}},
                         file, sizeof(TrainedSample));
}

hid_t create_link_type(bool file) {
  const hid_t i64 = file ? H5T_STD_I64LE : H5T_NATIVE_INT64;
  const hid_t i32 = file ? H5T_STD_I32LE : H5T_NATIVE_INT32;
  return create_compound({{"link_class", i32, offsetof(LinkTraffic, link_class)},
                          {"bytes", i64, offsetof(LinkTraffic, bytes)},
                          {"messages", i64, offsetof(LinkTraffic, messages)}},
                         file, sizeof(LinkTraffic));
}

hid_t create_router_load_type(bool file) {
  const hid_t i64 = file ? H5T_STD_I64LE : H5T_NATIVE_INT64;
  const hid_t i32 = file ? H5T_STD_I32LE : H5T_NATIVE_INT32;
  return create_compound({{"step", i32, offsetof(RouterLoad, step)},
                          {"layer", i32, offsetof(RouterLoad, layer)},
                          {"expert", i32, offsetof(RouterLoad, expert)},
                          {"tokens", i64, offsetof(RouterLoad, tokens)}},
                         file, sizeof(RouterLoad));
}

hid_t create_migration_type(bool file) {
  const hid_t f64 = file ? H5T_IEEE_F64LE : H5T_NATIVE_DOUBLE;
  const hid_t i64 = file ? H5T_STD_I64LE : H5T_NATIVE_INT64;
  const hid_t i32 = file ? H5T_STD_I32LE : H5T_NATIVE_INT32;
  return create_compound(
      {{"step", i32, offsetof(ExpertMigration, step)},
       {"experts_moved", i32, offsetof(ExpertMigration, experts_moved)},
       {"bytes", i64, offsetof(ExpertMigration, bytes)},
       {"predicted_gain_seconds", f64, offsetof(ExpertMigration, predicted_gain_seconds)},
       {"cost_seconds", f64, offsetof(ExpertMigration, cost_seconds)},
       {"max_mean_before", f64, offsetof(ExpertMigration, max_mean_before)},
       {"max_mean_after", f64, offsetof(ExpertMigration, max_mean_after)}},
      file, sizeof(ExpertMigration));
}

}  // namespace

hid_t create_event_memory_type() {
  return create_event_type(/*file=*/false);
}
hid_t create_event_file_type() {
  return create_event_type(/*file=*/true);
}
hid_t create_sample_memory_type() {
  return create_sample_type(/*file=*/false);
}
hid_t create_sample_file_type() {
  return create_sample_type(/*file=*/true);
}
hid_t create_link_memory_type() {
  return create_link_type(/*file=*/false);
}
hid_t create_link_file_type() {
  return create_link_type(/*file=*/true);
}
hid_t create_router_load_memory_type() {
  return create_router_load_type(/*file=*/false);
}
hid_t create_router_load_file_type() {
  return create_router_load_type(/*file=*/true);
}
hid_t create_migration_memory_type() {
  return create_migration_type(/*file=*/false);
}
hid_t create_migration_file_type() {
  return create_migration_type(/*file=*/true);
}

hid_t create_routing_memory_type() {
  return H5Tcopy(H5T_NATIVE_INT32);
}
hid_t create_routing_file_type() {
  return H5Tcopy(H5T_STD_I32LE);
}

}  // namespace rlf::trace_format
