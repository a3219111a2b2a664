#include "src/io/trace_format.h"

#include <cstddef>
#include <cstdio>
#include <stdexcept>

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

// Members in TraceEvent order; `file` packs them with little-endian types, the memory type
// follows the struct's own offsets.
hid_t create_event_type(bool file) {
  static_assert(sizeof(Phase) == sizeof(int32_t));
  const hid_t f64 = file ? H5T_IEEE_F64LE : H5T_NATIVE_DOUBLE;
  const hid_t i64 = file ? H5T_STD_I64LE : H5T_NATIVE_INT64;
  const hid_t i32 = file ? H5T_STD_I32LE : H5T_NATIVE_INT32;
  Handle phase{create_phase_type(i32), H5Tclose};
  struct Member {
    const char* name;
    hid_t type;
    size_t offset;
  };
  const Member members[] = {
      {"phase", phase.id, offsetof(TraceEvent, phase)},
      {"begin", f64, offsetof(TraceEvent, begin)},
      {"end", f64, offsetof(TraceEvent, end)},
      {"tokens", i64, offsetof(TraceEvent, tokens)},
      {"bytes", i64, offsetof(TraceEvent, bytes)},
      {"version", i32, offsetof(TraceEvent, version)},
      {"memory_bytes", i64, offsetof(TraceEvent, memory_bytes)},
  };
  size_t packed_size = 0;
  for (const Member& m : members) packed_size += H5Tget_size(m.type);
  const hid_t type = H5Tcreate(H5T_COMPOUND, file ? packed_size : sizeof(TraceEvent));
  size_t packed_offset = 0;
  for (const Member& m : members) {
    check(H5Tinsert(type, m.name, file ? packed_offset : m.offset, m.type), "building the type");
    packed_offset += H5Tget_size(m.type);
  }
  return type;
}

}  // namespace

hid_t create_event_memory_type() {
  return create_event_type(/*file=*/false);
}
hid_t create_event_file_type() {
  return create_event_type(/*file=*/true);
}

}  // namespace rlf::trace_format
