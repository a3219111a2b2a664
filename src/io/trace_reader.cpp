#include "src/io/trace_reader.h"

#include <hdf5.h>

#include <cmath>
#include <filesystem>
#include <string>
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
      data.samples[size_t(r)] =
          read_optional<TrainedSample>(file.id, trace_format::rank_samples(r), sample_type.id);
    }
    Handle link_type{trace_format::create_link_memory_type(), H5Tclose};
    data.links.resize(size_t(data.world_size));
    for (int r = 0; r < data.world_size; ++r) {
      data.links[size_t(r)] =
          read_optional<LinkTraffic>(file.id, trace_format::rank_links(r), link_type.id);
    }
    Handle load_type{trace_format::create_router_load_memory_type(), H5Tclose};
    Handle migration_type{trace_format::create_migration_memory_type(), H5Tclose};
    data.router_loads.resize(size_t(data.world_size));
    data.migrations.resize(size_t(data.world_size));
    for (int r = 0; r < data.world_size; ++r) {
      data.router_loads[size_t(r)] =
          read_optional<RouterLoad>(file.id, trace_format::rank_router_loads(r), load_type.id);
      data.migrations[size_t(r)] = read_optional<ExpertMigration>(
          file.id, trace_format::rank_migrations(r), migration_type.id);
    }
    Handle routing_type{trace_format::create_routing_memory_type(), H5Tclose};
    data.routing.resize(size_t(data.world_size));
    for (int r = 0; r < data.world_size; ++r) {
      data.routing[size_t(r)] =
          read_optional<int32_t>(file.id, trace_format::rank_routing(r), routing_type.id);
    }
    const std::string impossible = trace_value_error(data);
    if (!impossible.empty()) fail("is damaged: " + impossible);
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
    return events;
  }

  // A per-rank dataset added after the first trace format (samples, links): none when absent.
  template <typename Row>
  std::vector<Row> read_optional(hid_t file, const std::string& name, hid_t memory_type) const {
    if (H5Lexists(file, name.c_str(), H5P_DEFAULT) <= 0) return {};  // an older trace
    Handle set{H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose};
    Handle space{H5Dget_space(set.id), H5Sclose};
    hsize_t count = 0;
    if (set.id < 0 || space.id < 0 || H5Sget_simple_extent_ndims(space.id) != 1 ||
        H5Sget_simple_extent_dims(space.id, &count, nullptr) < 0) {
      fail("has a malformed dataset " + name);
    }
    std::vector<Row> rows(count);
    if (count > 0 && H5Dread(set.id, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, rows.data()) < 0) {
      fail("has an unreadable dataset " + name);
    }
    return rows;
  }

  std::string path_;
};

}  // namespace

std::string trace_value_error(const TraceData& trace) {
  const auto at = [](const char* what, size_t rank, size_t index) {
    return "rank " + std::to_string(rank) + " " + what + " " + std::to_string(index) + ": ";
  };
  if (trace.world_size < 1 || trace.ranks.size() != size_t(trace.world_size)) {
    return "world_size " + std::to_string(trace.world_size) + " does not match its " +
           std::to_string(trace.ranks.size()) + " ranks";
  }
  for (size_t r = 0; r < trace.ranks.size(); ++r) {
    for (size_t i = 0; i < trace.ranks[r].size(); ++i) {
      const TraceEvent& e = trace.ranks[r][i];
      if (int(e.phase) < 0 || int(e.phase) >= kPhaseCount) {
        return at("event", r, i) + "unknown phase " + std::to_string(int(e.phase));
      }
      // Times are seconds since the run's epoch: finite, and no run lasts 10^9 s.
      if (!std::isfinite(e.begin) || !std::isfinite(e.end) || std::fabs(e.begin) > 1e9 ||
          std::fabs(e.end) > 1e9 || e.end < e.begin) {
        return at("event", r, i) + "impossible times [" + std::to_string(e.begin) + ", " +
               std::to_string(e.end) + "]";
      }
      if (e.tokens < 0 || e.bytes < 0 || e.memory_bytes < 0 || e.version < kNoVersion) {
        return at("event", r, i) + "negative count or version";
      }
    }
  }
  for (size_t r = 0; r < trace.samples.size(); ++r) {
    for (size_t i = 0; i < trace.samples[r].size(); ++i) {
      const TrainedSample& s = trace.samples[r][i];
      if (s.version_min < 0 || s.version_max < s.version_min || s.trained_version < s.version_max) {
        return at("sample", r, i) + "versions out of order";
      }
      if (s.prompt_tokens < -1 || s.response_tokens < -1) {
        return at("sample", r, i) + "negative length";
      }
    }
  }
  for (size_t r = 0; r < trace.links.size(); ++r) {
    for (size_t i = 0; i < trace.links[r].size(); ++i) {
      const LinkTraffic& l = trace.links[r][i];
      if (l.link_class < 0 || l.link_class > 1 || l.bytes < 0 || l.messages < 0) {
        return at("link row", r, i) + "impossible link class or count";
      }
    }
  }
  // Layers and experts index the report's tables: bounded like any model's.
  constexpr int32_t kMostExpertsOrLayers = 1 << 16;
  for (size_t r = 0; r < trace.router_loads.size(); ++r) {
    for (size_t i = 0; i < trace.router_loads[r].size(); ++i) {
      const RouterLoad& l = trace.router_loads[r][i];
      if (l.step < 0 || l.layer < 0 || l.layer >= kMostExpertsOrLayers || l.expert < 0 ||
          l.expert >= kMostExpertsOrLayers || l.tokens < 0) {
        return at("router load", r, i) + "impossible step, layer, expert or count";
      }
    }
  }
  for (size_t r = 0; r < trace.migrations.size(); ++r) {
    for (size_t i = 0; i < trace.migrations[r].size(); ++i) {
      const ExpertMigration& m = trace.migrations[r][i];
      bool finite = true;
      for (double x :
           {m.predicted_gain_seconds, m.cost_seconds, m.max_mean_before, m.max_mean_after}) {
        finite = finite && std::isfinite(x) && x >= 0 && x < 1e12;
      }
      if (m.step < 0 || m.experts_moved < 0 || m.bytes < 0 || !finite) {
        return at("migration", r, i) + "impossible step, count or figure";
      }
    }
  }
  return "";
}

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
