#include "src/io/trace_reader.h"

#include <hdf5.h>

#include <filesystem>
#include <vector>

#include "kernels/error.h"
#include "src/io/trace_format.h"

namespace rlf {

namespace {

using trace_format::Handle;

// HDF5 would print its error stack for every failed call; a ConfigError says it once. Unlike
// H5E_BEGIN_TRY/H5E_END_TRY, this restores printing when an exception leaves the scope.
struct QuietHdf5 {
  H5E_auto2_t function = nullptr;
  void* data = nullptr;
  QuietHdf5() {
    H5Eget_auto2(H5E_DEFAULT, &function, &data);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~QuietHdf5() { H5Eset_auto2(H5E_DEFAULT, function, data); }
  QuietHdf5(const QuietHdf5&) = delete;
  QuietHdf5& operator=(const QuietHdf5&) = delete;
};

herr_t collect_name(hid_t, const char* name, const H5A_info_t*, void* names) {
  static_cast<std::vector<std::string>*>(names)->push_back(name);
  return 0;
}

// The value of a fixed-length string attribute; false when `name` is not one.
bool read_string_attribute(hid_t object, const std::string& name, std::string& value) {
  Handle attr{H5Aopen(object, name.c_str(), H5P_DEFAULT), H5Aclose};
  if (attr.id < 0) return false;
  Handle type{H5Aget_type(attr.id), H5Tclose};
  if (type.id < 0 || H5Tget_class(type.id) != H5T_STRING || H5Tis_variable_str(type.id) != 0) {
    return false;
  }
  std::vector<char> buffer(H5Tget_size(type.id) + 1, '\0');
  if (H5Aread(attr.id, type.id, buffer.data()) < 0) return false;
  value = buffer.data();
  return true;
}

class Reader {
 public:
  explicit Reader(const std::string& path) : path_(path) {}

  [[noreturn]] void fail(const std::string& why) const {
    throw ConfigError("trace '" + path_ + "' " + why);
  }

  TraceData read() {
    if (!std::filesystem::exists(path_)) fail("does not exist");
    Handle file{H5Fopen(path_.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose};
    if (file.id < 0) fail("is not an HDF5 file (or is damaged)");
    std::string format;
    if (!read_string_attribute(file.id, trace_format::kFormatAttribute, format) ||
        format != trace_format::kFormat) {
      fail("is not an rlfusion trace (no format attribute '" + std::string(trace_format::kFormat) +
           "')");
    }
    TraceData data;
    data.world_size = read_world_size(file.id);
    std::vector<std::string> names;
    hsize_t index = 0;
    if (H5Aiterate2(file.id, H5_INDEX_NAME, H5_ITER_INC, &index, collect_name, &names) < 0) {
      fail("has unreadable attributes");
    }
    for (const std::string& name : names) {
      std::string value;
      if (name != trace_format::kFormatAttribute && read_string_attribute(file.id, name, value)) {
        data.metadata[name] = value;
      }
    }
    Handle memory_type{trace_format::create_event_memory_type(), H5Tclose};
    data.ranks.resize(size_t(data.world_size));
    for (int r = 0; r < data.world_size; ++r) {
      data.ranks[size_t(r)] = read_events(file.id, r, memory_type.id);
    }
    Handle sample_type{trace_format::create_sample_memory_type(), H5Tclose};
    data.samples.resize(size_t(data.world_size));
    for (int r = 0; r < data.world_size; ++r) {
      data.samples[size_t(r)] = read_samples(file.id, r, sample_type.id);
    }
    return data;
  }

 private:
  int read_world_size(hid_t file) const {
    Handle attr{H5Aopen(file, trace_format::kWorldSizeAttribute, H5P_DEFAULT), H5Aclose};
    int64_t size = 0;
    if (attr.id < 0 || H5Aread(attr.id, H5T_NATIVE_INT64, &size) < 0) {
      fail("has no world_size attribute");
    }
    if (size < 1 || size > (1 << 24)) fail("has world_size " + std::to_string(size));
    return int(size);
  }

  std::vector<TraceEvent> read_events(hid_t file, int rank, hid_t memory_type) const {
    const std::string name = trace_format::rank_events(rank);
    Handle set{H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose};
    if (set.id < 0)
      fail("has no dataset " + name + " (world_size is " + std::to_string(rank + 1) + " or more)");
    Handle space{H5Dget_space(set.id), H5Sclose};
    hsize_t count = 0;
    if (space.id < 0 || H5Sget_simple_extent_ndims(space.id) != 1 ||
        H5Sget_simple_extent_dims(space.id, &count, nullptr) < 0) {
      fail("has a malformed dataset " + name);
    }
    std::vector<TraceEvent> events(count);
    // The enum conversion maps phases by name, so a phase this build does not know fails here.
    if (count > 0 &&
        H5Dread(set.id, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, events.data()) < 0) {
      fail("has an unreadable dataset " + name + " (damaged, or not trace events)");
    }
    for (const TraceEvent& e : events) {
      if (int(e.phase) < 0 || int(e.phase) >= kPhaseCount) fail("has an unknown phase in " + name);
    }
    return events;
  }

  std::vector<TrainedSample> read_samples(hid_t file, int rank, hid_t memory_type) const {
    const std::string name = trace_format::rank_samples(rank);
    if (H5Lexists(file, name.c_str(), H5P_DEFAULT) <= 0) return {};  // an older trace
    Handle set{H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose};
    Handle space{H5Dget_space(set.id), H5Sclose};
    hsize_t count = 0;
    if (set.id < 0 || space.id < 0 || H5Sget_simple_extent_ndims(space.id) != 1 ||
        H5Sget_simple_extent_dims(space.id, &count, nullptr) < 0) {
      fail("has a malformed dataset " + name);
    }
    std::vector<TrainedSample> samples(count);
    if (count > 0 &&
        H5Dread(set.id, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, samples.data()) < 0) {
      fail("has an unreadable dataset " + name);
    }
    return samples;
  }

  std::string path_;
};

}  // namespace

size_t TraceData::event_count() const {
  size_t count = 0;
  for (const auto& events : ranks) count += events.size();
  return count;
}

TraceData read_trace(const std::string& path) {
  const QuietHdf5 quiet;
  return Reader(path).read();
}

}  // namespace rlf
