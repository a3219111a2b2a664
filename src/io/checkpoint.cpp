#include "src/io/checkpoint.h"

#include <tbb/parallel_for.h>
#include <tbb/task_group.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "kernels/error.h"
#include "src/io/durable_file.h"
#include "src/io/hdf5_helpers.h"
#include "src/io/mapped_file.h"
#include "src/io/stream_copy.h"
#include "src/model/expert_parallel.h"

namespace rlf {

using namespace hdf5;
namespace fs = std::filesystem;

namespace {

// Format 3: an expert-parallel run's placement and rebalancer state in /placement (format 2 had
// none: such a file resumes at the default placement; format 1 had CRC-64/XZ checksums).
constexpr const char* kFormat = "rlfusion-checkpoint-3";
constexpr const char* kFormatWithoutPlacement = "rlfusion-checkpoint-2";
constexpr const char* kSidecarSuffix = ".crc32c";
constexpr const char* kCrcAttribute = "crc32c";
constexpr const char* kLatest = "latest";

std::string label(const std::string& path) {
  return "checkpoint '" + path + "'";
}

// "checkpoint 'PATH' dataset 'GROUP/NAME'", for messages.
std::string where_in(const std::string& path, const char* group, const std::string& name) {
  return label(path) + " dataset '" + group + "/" + name + "'";
}

std::string checkpoint_directory(const std::string& run_dir) {
  return run_dir + "/checkpoints";
}

// step_NNNNNN.h5 -> NNNNNN; -1 for any other name.
int step_of(const std::string& name) {
  if (name.size() < 14 || !name.starts_with("step_") || !name.ends_with(".h5")) return -1;
  const std::string digits = name.substr(5, name.size() - 8);
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return -1;
  return std::stoi(digits);
}

// Tests only (RLFUSION_TEST_KILL_IN_CHECKPOINT=STEP or STEP:renamed): the writer of checkpoint
// STEP kills itself with SIGKILL halfway through the HDF5 data, or just after the data file got
// its final name but before its sidecar and `latest`, as a crash or the scheduler would.
void test_kill_point(int step, const char* where) {
  const char* hook = std::getenv("RLFUSION_TEST_KILL_IN_CHECKPOINT");
  if (!hook) return;
  const std::string value(hook);
  const std::string at = std::to_string(step);
  if (value == at + (std::string(where) == "data" ? "" : std::string(":") + where)) {
    std::raise(SIGKILL);
  }
}

void write_u64_attribute(hid_t object, const char* name, uint64_t value) {
  Handle space{H5Screate(H5S_SCALAR), H5Sclose};
  Handle attr{H5Acreate2(object, name, H5T_STD_U64LE, space.id, H5P_DEFAULT, H5P_DEFAULT),
              H5Aclose};
  check(H5Awrite(attr.id, H5T_NATIVE_UINT64, &value), std::string("writing attribute ") + name);
}

uint64_t read_u64_attribute(hid_t object, const std::string& where, const char* name) {
  if (H5Aexists(object, name) <= 0) throw ConfigError(where + " has no attribute '" + name + "'");
  Handle attr{H5Aopen(object, name, H5P_DEFAULT), H5Aclose};
  uint64_t value = 0;
  check(H5Aread(attr.id, H5T_NATIVE_UINT64, &value), std::string("reading attribute ") + name);
  return value;
}

Handle create_group(hid_t parent, const char* name) {
  return {H5Gcreate2(parent, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose};
}

Handle open_group(hid_t parent, const std::string& path, const char* name) {
  Handle group{-1, H5Gclose};
  H5E_BEGIN_TRY {
    group.id = H5Gopen2(parent, name, H5P_DEFAULT);
  }
  H5E_END_TRY;
  if (group.id < 0) throw ConfigError(label(path) + " has no group '" + name + "'");
  return group;
}

// The tensor as stored in the file: routed-expert tensors hold every expert of the model, however
// many the layout stores.
std::vector<hsize_t> file_shape(const ParameterTensor& t, const ModelConfig& config) {
  std::vector<hsize_t> shape(t.shape.begin(), t.shape.end());
  if (t.routed_expert) shape[0] = hsize_t(config.n_experts);
  return shape;
}

// CRC-32C of each stored expert's rows of a routed-expert tensor (so that a reader holding other
// experts checks exactly what it reads), else of the whole tensor.
std::vector<uint32_t> piece_crcs(const ParameterTensor& t, const float* data) {
  const int64_t pieces = t.routed_expert ? t.shape[0] : 1;
  const int64_t each = t.numel / pieces;
  std::vector<uint32_t> crcs(static_cast<size_t>(pieces));
  for (int64_t i = 0; i < pieces; ++i) {
    crcs[size_t(i)] = crc32c(data + t.offset + i * each, size_t(each) * sizeof(float));
  }
  return crcs;
}

void write_crc_attribute(hid_t object, const std::vector<uint32_t>& crcs) {
  const hsize_t count = crcs.size();
  Handle space{H5Screate_simple(1, &count, nullptr), H5Sclose};
  Handle attr{H5Acreate2(object, kCrcAttribute, H5T_STD_U32LE, space.id, H5P_DEFAULT, H5P_DEFAULT),
              H5Aclose};
  check(H5Awrite(attr.id, H5T_NATIVE_UINT32, crcs.data()), "writing a checksum attribute");
}

std::vector<uint32_t> read_crc_attribute(hid_t object, const std::string& where, size_t count) {
  if (H5Aexists(object, kCrcAttribute) <= 0) {
    throw ConfigError(where + " has no attribute '" + kCrcAttribute + "'");
  }
  Handle attr{H5Aopen(object, kCrcAttribute, H5P_DEFAULT), H5Aclose};
  Handle space{H5Aget_space(attr.id), H5Sclose};
  if (H5Sget_simple_extent_npoints(space.id) != hssize_t(count)) {
    throw ConfigError(where + " has " + std::to_string(H5Sget_simple_extent_npoints(space.id)) +
                      " checksums, not " + std::to_string(count) + ": the file is damaged");
  }
  std::vector<uint32_t> crcs(count);
  check(H5Aread(attr.id, H5T_NATIVE_UINT32, crcs.data()), "reading a checksum attribute");
  return crcs;
}

// Who writes what: the whole model by one process (comm null), or the ranks of `comm` together
// into the one file, each rank storing part of the model (an EP group's ranks their own experts,
// a pipeline's stages their layers, or both). Every tensor a rank does not write row by row is
// written by its owner (the lowest rank storing it; rank 0 the counters, samples in flight and
// placement), and every raw-data write is a collective MPI-IO call (`transfer`:
// H5FD_MPIO_COLLECTIVE) that ranks with nothing to write join with an empty selection, so MPI-IO
// can aggregate the pieces (two-phase I/O).
struct Writers {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  hid_t transfer = H5P_DEFAULT;  // dataset transfer properties of every write
  // [file tensor] -> the rank that writes it whole (empty: rank 0 writes every one)
  std::vector<int> owner;
  // [layer][slot] -> the expert it holds (empty: the identity, no migration, no spare slots)
  std::vector<std::vector<int>> expert_of_slot;
  // [layer][expert] -> its first replica's slot (the lowest), the one whose rows are written
  std::vector<std::vector<int>> first_slot;

  int owner_of(size_t tensor) const { return owner.empty() ? 0 : owner[tensor]; }
  int expert_at(const ParameterTensor& t, int slot) const {
    return expert_of_slot.empty() ? slot : expert_of_slot[size_t(tensor_layer(t))][size_t(slot)];
  }
  // Whether `slot` holds the copy of its expert that goes into the file.
  bool writes_slot(const ParameterTensor& t, int slot) const {
    return first_slot.empty() ||
           first_slot[size_t(tensor_layer(t))][size_t(expert_at(t, slot))] == slot;
  }
};

// All of `set` from `data` on rank `owner` of the writers; the others join with nothing selected.
void write_whole(hid_t set, hid_t memory_type, const void* data, const Writers& writers,
                 int owner = 0) {
  Handle file_space{H5Dget_space(set), H5Sclose};
  if (H5Sget_simple_extent_npoints(file_space.id) <= 0) return;  // the same on every rank
  if (writers.rank == owner) {
    check(H5Dwrite(set, memory_type, H5S_ALL, H5S_ALL, writers.transfer, data), "writing data");
    return;
  }
  check(H5Sselect_none(file_space.id), "selecting nothing");
  Handle memory_space{H5Scopy(file_space.id), H5Sclose};
  check(H5Sselect_none(memory_space.id), "selecting nothing");
  const char nothing = 0;
  check(H5Dwrite(set, memory_type, memory_space.id, file_space.id, writers.transfer, &nothing),
        "joining a collective write");
}

// Rows [first, first + rows) of dimension 0 of a dataset (its file space selection) and a
// contiguous memory buffer of their shape.
struct RowSelection {
  Handle file_space{-1, H5Sclose};
  Handle memory_space{-1, H5Sclose};
};

RowSelection select_rows(hid_t set, const std::vector<hsize_t>& shape, hsize_t first,
                         hsize_t rows) {
  RowSelection selection;
  selection.file_space.id = H5Dget_space(set);
  std::vector<hsize_t> start(shape.size(), 0), count = shape;
  start[0] = first;
  count[0] = rows;
  check(H5Sselect_hyperslab(selection.file_space.id, H5S_SELECT_SET, start.data(), nullptr,
                            count.data(), nullptr),
        "selecting rows");
  selection.memory_space.id = H5Screate_simple(int(count.size()), count.data(), nullptr);
  return selection;
}

void write_rows(hid_t set, const std::vector<hsize_t>& shape, hsize_t first, hsize_t rows,
                const float* data, hid_t transfer) {
  const RowSelection s = select_rows(set, shape, first, rows);
  check(H5Dwrite(set, H5T_NATIVE_FLOAT, s.memory_space.id, s.file_space.id, transfer, data),
        "writing a tensor");
}

// This rank's stored rows of a routed-expert tensor (`data`, local slot order) into the rows of
// the experts they hold: one collective write of the union of those rows (HDF5 walks a selection
// in file order, so the memory buffer is packed in ascending expert id).
void write_expert_rows(hid_t set, const std::vector<hsize_t>& shape, const ParameterTensor& t,
                       int first_slot, const float* data, const Writers& writers) {
  const int rows = int(t.shape[0]);
  std::vector<std::pair<int, int>> by_expert;  // (expert, local row), first replicas only
  for (int j = 0; j < rows; ++j) {
    if (writers.writes_slot(t, first_slot + j))
      by_expert.push_back({writers.expert_at(t, first_slot + j), j});
  }
  std::sort(by_expert.begin(), by_expert.end());
  const size_t each = size_t(t.numel / t.shape[0]);
  std::vector<float> packed(std::max<size_t>(by_expert.size(), 1) * each);
  Handle file_space{H5Dget_space(set), H5Sclose};
  check(H5Sselect_none(file_space.id), "selecting nothing");
  if (by_expert.empty()) {  // every slot here holds a later replica: join with nothing
    Handle memory_space{H5Scopy(file_space.id), H5Sclose};
    check(H5Sselect_none(memory_space.id), "selecting nothing");
    check(H5Dwrite(set, H5T_NATIVE_FLOAT, memory_space.id, file_space.id, writers.transfer,
                   packed.data()),
          "joining a collective write");
    return;
  }
  std::vector<hsize_t> start(shape.size(), 0), count = shape;
  count[0] = 1;
  for (size_t i = 0; i < by_expert.size(); ++i) {
    std::copy_n(data + size_t(by_expert[i].second) * each, each, packed.begin() + i * each);
    start[0] = hsize_t(by_expert[i].first);
    check(H5Sselect_hyperslab(file_space.id, H5S_SELECT_OR, start.data(), nullptr, count.data(),
                              nullptr),
          "selecting expert rows");
  }
  count[0] = hsize_t(by_expert.size());
  Handle memory_space{H5Screate_simple(int(count.size()), count.data(), nullptr), H5Sclose};
  check(H5Dwrite(set, H5T_NATIVE_FLOAT, memory_space.id, file_space.id, writers.transfer,
                 packed.data()),
        "writing a tensor");
}

void read_rows(hid_t set, const std::vector<hsize_t>& shape, hsize_t first, hsize_t rows,
               float* data) {
  const RowSelection s = select_rows(set, shape, first, rows);
  check(H5Dread(set, H5T_NATIVE_FLOAT, s.memory_space.id, s.file_space.id, H5P_DEFAULT, data),
        "reading a tensor");
}

// Every tensor of the model from `data` (laid out by `layout`, the part this rank stores), each
// with the CRC-32C of its bytes (per expert for the routed-expert tensors). The CRCs are computed
// by worker threads while this thread hands the tensors to HDF5 (which is not thread-safe, so it
// stays on one thread); the attributes follow once both are done. With several writers, dataset
// creation and attributes are collective (each CRC merged from the rank that wrote its piece: the
// others contribute zeros to a bitwise or) and each rank writes what it owns: its experts' rows of
// the routed-expert tensors it stores, a whole tensor when it is the tensor's owner.
void write_tensors(hid_t parent, const char* name, const ModelConfig& config,
                   const ParameterLayout& layout, const float* data, const Writers& writers) {
  Handle group = create_group(parent, name);
  const bool together = writers.comm != MPI_COMM_NULL;
  // The file's tensors: the whole model's (one writer: `layout` is the whole model).
  const ParameterLayout whole_model = together ? ParameterLayout(config) : layout;
  const std::vector<ParameterTensor>& tensors = whole_model.tensors();
  // This rank's copy of each file tensor (null: another rank stores it).
  std::vector<const ParameterTensor*> local(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) local[i] = layout.find(tensors[i].name);
  // Routed experts go row by row (by expert id, from each expert's first replica) from every rank
  // storing them.
  auto by_rows = [&](size_t i) { return tensors[i].routed_expert; };
  auto writes = [&](size_t i) {
    return local[i] && (by_rows(i) || writers.rank == writers.owner_of(i));
  };
  std::vector<std::vector<uint32_t>> crcs(tensors.size());
  tbb::task_group checksums;
  checksums.run([&] {
    tbb::parallel_for(size_t(0), tensors.size(), [&](size_t i) {
      if (writes(i)) crcs[i] = piece_crcs(*local[i], data);
    });
  });
  try {
    for (size_t i = 0; i < tensors.size(); ++i) {
      const ParameterTensor& t = tensors[i];
      const std::vector<hsize_t> shape = file_shape(t, config);
      Handle space{H5Screate_simple(int(shape.size()), shape.data(), nullptr), H5Sclose};
      Handle set{H5Dcreate2(group.id, t.name.c_str(), H5T_IEEE_F32LE, space.id, H5P_DEFAULT,
                            H5P_DEFAULT, H5P_DEFAULT),
                 H5Dclose};
      check(set.id < 0 ? -1 : 0, "creating dataset " + t.name);
      if (by_rows(i) && local[i] && writers.expert_of_slot.empty()) {
        write_rows(set.id, shape, hsize_t(layout.first_expert()), hsize_t(local[i]->shape[0]),
                   data + local[i]->offset, writers.transfer);
      } else if (by_rows(i) && local[i]) {
        write_expert_rows(set.id, shape, *local[i], layout.first_expert(), data + local[i]->offset,
                          writers);
      } else {
        // A rank without the tensor (another stage's) joins with nothing, as a non-owner does.
        const int owner = by_rows(i) ? -1 : writers.owner_of(i);
        write_whole(set.id, H5T_NATIVE_FLOAT, writes(i) ? data + local[i]->offset : nullptr,
                    writers, owner);
      }
    }
  } catch (...) {
    checksums.wait();
    throw;
  }
  checksums.wait();
  if (together) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      std::vector<uint32_t> merged(size_t(tensors[i].routed_expert ? config.n_experts : 1), 0);
      if (writes(i) && by_rows(i)) {
        for (int j = 0; j < int(local[i]->shape[0]); ++j) {
          const int slot = layout.first_expert() + j;
          if (writers.writes_slot(tensors[i], slot))
            merged[size_t(writers.expert_at(tensors[i], slot))] = crcs[i][size_t(j)];
        }
      } else if (writes(i)) {
        merged = crcs[i];
      }
      MPI_Allreduce(MPI_IN_PLACE, merged.data(), int(merged.size()), MPI_UINT32_T, MPI_BOR,
                    writers.comm);
      crcs[i] = std::move(merged);
    }
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    Handle set{H5Dopen2(group.id, tensors[i].name.c_str(), H5P_DEFAULT), H5Dclose};
    write_crc_attribute(set.id, crcs[i]);
  }
}

// Where row `first` of a dataset lies in the mapped file, when HDF5 stores it
// as one contiguous run of native floats (how checkpoints are written); null otherwise (then
// HDF5 reads it).
const unsigned char* contiguous_rows(hid_t set, const std::vector<hsize_t>& shape, hsize_t first,
                                     const MappedFile& mapped) {
  Handle type{H5Dget_type(set), H5Tclose};
  if (H5Tequal(type.id, H5T_NATIVE_FLOAT) <= 0) return nullptr;
  const haddr_t offset = H5Dget_offset(set);  // HADDR_UNDEF unless contiguous and allocated
  if (offset == HADDR_UNDEF) return nullptr;
  uint64_t row_bytes = sizeof(float);
  for (size_t d = 1; d < shape.size(); ++d) row_bytes *= shape[d];
  const uint64_t all_bytes = row_bytes * (shape.empty() ? 1 : shape[0]);
  if (offset > mapped.size() || all_bytes > mapped.size() - offset) return nullptr;
  return mapped.data() + offset + first * row_bytes;
}

// Copies `bytes` from `from` (null: already in place) to `to` and returns their CRC-32C, block by
// block: each block is checksummed from the source (which brings it into the cache) and then
// written with streaming stores, which skip reading the destination's cache lines first (the
// tensors are far larger than the cache and not touched again before training).
uint32_t copy_and_crc(float* to, const unsigned char* from, size_t bytes) {
  auto* out = reinterpret_cast<unsigned char*>(to);
  if (!from) return crc32c(out, bytes);
  constexpr size_t kBlock = size_t(128) << 10;
  uint32_t crc = 0;
  for (size_t at = 0; at < bytes; at += kBlock) {
    const size_t n = std::min(kBlock, bytes - at);
    crc = crc32c(from + at, n, crc);
    stream_copy(out + at, from + at, n);
  }
  stream_copy_fence();
  return crc;
}

// Every tensor of the layout into `data` (of a routed-expert tensor, the rows of the experts the
// layout stores: a checkpoint loads at any expert-parallel degree; with `slot_experts`, row j of
// layer l gets expert slot_experts[l][first_expert() + j], replicas included). This thread reads
// the metadata through HDF5 (which is not thread-safe); the rows of contiguous datasets are copied
// from the verified mapping of the file by worker threads, each piece checked against its
// CRC-32C as it is copied (any other dataset is read by HDF5 here and checked by a worker).
// With a tensor-parallel layout each cut tensor's checksum is taken over the whole tensor in the
// file and only this rank's slice copied out (a non-contiguous dataset is read whole into a
// temporary, checked and sliced here, then freed), so no whole-model buffer is ever allocated.
void read_tensors(hid_t parent, const std::string& path, const char* name,
                  const ModelConfig& config, const ParameterLayout& layout, float* data,
                  const MappedFile& mapped, const std::vector<std::vector<int>>* slot_experts) {
  if (slot_experts == nullptr && layout.redundant_slots() > 0) {
    throw std::invalid_argument("read_checkpoint: spare expert slots need slot_experts");
  }
  Handle group = open_group(parent, path, name);
  const std::vector<ParameterTensor>& tensors = layout.tensors();
  // The tensors as the file holds them: index for index the layout's, uncut (built only for a
  // tensor-parallel layout; otherwise the layout itself).
  std::optional<ParameterLayout> uncut_layout;
  if (layout.tensor_slice().active()) {
    uncut_layout.emplace(config, layout.stored_expert_shard(), layout.layer_shard(), TensorSlice{});
  }
  const ParameterLayout& uncut = uncut_layout ? *uncut_layout : layout;
  std::vector<std::vector<uint32_t>> expected(tensors.size()), found(tensors.size());
  tbb::task_group copies;
  try {
    for (size_t i = 0; i < tensors.size(); ++i) {
      const ParameterTensor& t = uncut.tensors()[i];
      const bool cut = tensors[i].tp_split != ParameterTensor::TensorSplit::None;
      const std::string where = where_in(path, name, t.name);
      Handle set{-1, H5Dclose};
      H5E_BEGIN_TRY {
        set.id = H5Dopen2(group.id, t.name.c_str(), H5P_DEFAULT);
      }
      H5E_END_TRY;
      if (set.id < 0) throw ConfigError(where + " is missing: it was written for another model");
      const std::vector<hsize_t> shape = file_shape(t, config);
      Handle space{H5Dget_space(set.id), H5Sclose};
      std::vector<hsize_t> dims(size_t(std::max(0, H5Sget_simple_extent_ndims(space.id))));
      H5Sget_simple_extent_dims(space.id, dims.data(), nullptr);
      if (dims != shape) throw ConfigError(where + " has another shape than the configured model");
      // The file row of each stored row (piece): one for a replicated tensor.
      std::vector<hsize_t> file_rows(1, 0);
      if (t.routed_expert) {
        file_rows.resize(size_t(t.shape[0]));
        for (size_t j = 0; j < file_rows.size(); ++j) {
          const size_t slot = size_t(layout.first_expert()) + j;
          file_rows[j] =
              hsize_t(slot_experts ? (*slot_experts)[size_t(tensor_layer(t))][slot] : int(slot));
        }
      }
      const size_t pieces = file_rows.size();
      const size_t piece_bytes = size_t(t.numel) / pieces * sizeof(float);
      const std::vector<uint32_t> all =
          read_crc_attribute(set.id, where, t.routed_expert ? size_t(config.n_experts) : 1);
      for (hsize_t row : file_rows) expected[i].push_back(all[size_t(row)]);
      found[i].resize(pieces);
      const unsigned char* base = contiguous_rows(set.id, shape, 0, mapped);
      if (!base && cut) {
        std::vector<float> whole(size_t(t.numel));
        read_rows(set.id, shape, 0, hsize_t(t.shape[0]), whole.data());
        found[i][0] = crc32c(whole.data(), piece_bytes);
        slice_tensor(tensors[i], whole.data(), data + tensors[i].offset);
        continue;
      }
      if (!base) {
        for (size_t k = 0; k < pieces; ++k) {
          read_rows(set.id, shape, file_rows[k], t.routed_expert ? 1 : hsize_t(t.shape[0]),
                    data + tensors[i].offset + k * piece_bytes / sizeof(float));
        }
      }
      for (size_t k = 0; k < pieces; ++k) {
        const unsigned char* source = base ? base + file_rows[k] * piece_bytes : nullptr;
        copies.run([&, i, k, source, piece_bytes, cut] {
          if (cut) {  // one piece: the whole tensor, checked whole, its slice copied
            found[i][k] = crc32c(source, piece_bytes);
            slice_tensor(tensors[i], reinterpret_cast<const float*>(source),
                         data + tensors[i].offset);
            return;
          }
          float* to = data + tensors[i].offset + k * piece_bytes / sizeof(float);
          found[i][k] = copy_and_crc(to, source, piece_bytes);
        });
      }
    }
  } catch (...) {
    copies.wait();
    throw;
  }
  copies.wait();
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (found[i] != expected[i]) {
      throw ConfigError(where_in(path, name, tensors[i].name) +
                        " does not match its checksum: the file is damaged");
    }
  }
}

void write_step_rewards(hid_t file, const std::vector<double>& rewards, const Writers& writers) {
  const hsize_t count = rewards.size();
  Handle space{H5Screate_simple(1, &count, nullptr), H5Sclose};
  Handle set{H5Dcreate2(file, "step_rewards", H5T_IEEE_F64LE, space.id, H5P_DEFAULT, H5P_DEFAULT,
                        H5P_DEFAULT),
             H5Dclose};
  check(set.id < 0 ? -1 : 0, "creating step_rewards");
  write_whole(set.id, H5T_NATIVE_DOUBLE, rewards.data(), writers);
  write_crc_attribute(set.id, {crc32c(rewards.data(), rewards.size() * sizeof(double))});
}

std::vector<double> read_step_rewards(hid_t file, const std::string& path, size_t count) {
  std::vector<double> rewards(count);
  Handle set{-1, H5Dclose}, space{-1, H5Sclose};
  H5E_BEGIN_TRY {
    set.id = H5Dopen2(file, "step_rewards", H5P_DEFAULT);
    space.id = H5Dget_space(set.id);
  }
  H5E_END_TRY;
  if (set.id < 0 || H5Sget_simple_extent_npoints(space.id) != hssize_t(count)) {
    throw ConfigError(label(path) + " has no step_rewards of " + std::to_string(count) + " steps");
  }
  check(H5Dread(set.id, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, rewards.data()),
        "reading step_rewards");
  if (read_crc_attribute(set.id, label(path) + " dataset 'step_rewards'", 1)[0] !=
      crc32c(rewards.data(), count * sizeof(double))) {
    throw ConfigError(label(path) + " dataset 'step_rewards' does not match its checksum");
  }
  return rewards;
}

void write_counters(hid_t file, const CheckpointCounters& c, const Writers& writers) {
  write_int_attribute(file, "step", c.step);
  write_int_attribute(file, "optimizer_steps", c.optimizer_steps);
  write_int_attribute(file, "rl_tokens", c.rl_tokens);
  write_double_attribute(file, "rl_seconds", c.rl_seconds);
  write_int_attribute(file, "eval.initial_prompts", c.initial_prompts);
  write_int_attribute(file, "eval.initial_correct", c.initial_correct);
  write_int_attribute(file, "eval.before_rl_prompts", c.before_rl_prompts);
  write_int_attribute(file, "eval.before_rl_correct", c.before_rl_correct);
  write_u64_attribute(file, "run.seed", c.seed);
  write_int_attribute(file, "run.prompts", c.prompts);
  write_int_attribute(file, "run.group_size", c.group_size);
  write_int_attribute(file, "run.staleness", c.staleness);
  write_step_rewards(file, c.step_rewards, writers);
}

CheckpointCounters read_counters(hid_t file, const std::string& path) {
  auto number = [&](const char* name) { return read_number_attribute(file, label(path), name); };
  CheckpointCounters c;
  c.step = int(number("step"));
  c.optimizer_steps = int(number("optimizer_steps"));
  c.rl_tokens = int64_t(number("rl_tokens"));
  c.rl_seconds = number("rl_seconds");
  c.initial_prompts = int(number("eval.initial_prompts"));
  c.initial_correct = int(number("eval.initial_correct"));
  c.before_rl_prompts = int(number("eval.before_rl_prompts"));
  c.before_rl_correct = int(number("eval.before_rl_correct"));
  c.seed = read_u64_attribute(file, label(path), "run.seed");
  c.prompts = int(number("run.prompts"));
  c.group_size = int(number("run.group_size"));
  c.staleness = int(number("run.staleness"));
  if (H5Lexists(file, "in_flight", H5P_DEFAULT) > 0) {
    Handle group = open_group(file, path, "in_flight");
    c.in_flight_ranks = int(read_number_attribute(group.id, label(path), "ranks"));
  }
  c.step_rewards = read_step_rewards(file, path, size_t(c.step));
  return c;
}

// In-flight samples of rank r: /in_flight/rank_NNNNN/{samples, tokens, behaviour_logp}, the three
// arrays of PackedInFlight (`samples`: its int64 rows as a table). Each carries its CRC-32C.
constexpr int kInFlightColumns = PackedInFlight::kColumns;

std::string rank_group_name(int rank) {
  char name[32];
  std::snprintf(name, sizeof name, "rank_%05d", rank);
  return name;
}

// A dataset of `shape` with its CRC-32C. Collective with several writers: every rank passes the
// same shape and CRC, rank 0 the values (the others none).
template <typename T>
void write_checked_array(hid_t group, const char* name, hid_t file_type, hid_t memory_type,
                         const T* values, std::vector<hsize_t> shape, uint32_t crc,
                         const Writers& writers) {
  Handle space{H5Screate_simple(int(shape.size()), shape.data(), nullptr), H5Sclose};
  Handle set{H5Dcreate2(group, name, file_type, space.id, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
             H5Dclose};
  check(set.id < 0 ? -1 : 0, std::string("creating ") + name);
  write_whole(set.id, memory_type, values, writers);
  write_crc_attribute(set.id, {crc});
}

template <typename T>
std::vector<T> read_checked_array(hid_t group, const std::string& where, const char* name,
                                  hid_t memory_type, hsize_t count) {
  Handle set{-1, H5Dclose};
  H5E_BEGIN_TRY {
    set.id = H5Dopen2(group, name, H5P_DEFAULT);
  }
  H5E_END_TRY;
  if (set.id < 0) throw ConfigError(where + " has no dataset '" + name + "'");
  Handle space{H5Dget_space(set.id), H5Sclose};
  if (H5Sget_simple_extent_npoints(space.id) != hssize_t(count)) {
    throw ConfigError(where + " dataset '" + name + "' has the wrong size: the file is damaged");
  }
  std::vector<T> values(count);
  if (count > 0) {
    check(H5Dread(set.id, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()),
          std::string("reading ") + name);
  }
  if (read_crc_attribute(set.id, where, 1)[0] != crc32c(values.data(), count * sizeof(T))) {
    throw ConfigError(where + " dataset '" + name + "' does not match its checksum");
  }
  return values;
}

// Every rank's in-flight samples (`ranks`, on rank 0 of the writers). With several writers the
// datasets are created collectively: rank 0 broadcasts each array's size and CRC first.
void write_in_flight(hid_t file, const std::vector<std::vector<InFlightSample>>& ranks,
                     const Writers& writers) {
  std::vector<PackedInFlight> packed;
  for (const auto& samples : ranks) packed.push_back(PackedInFlight::pack(samples));
  // Per rank: row values, tokens, and the CRCs of the three arrays.
  std::vector<uint64_t> shape;
  for (const PackedInFlight& p : packed) {
    shape.insert(
        shape.end(),
        {p.rows.size(), p.tokens.size(), crc32c(p.rows.data(), p.rows.size() * 8),
         crc32c(p.tokens.data(), p.tokens.size() * 4), crc32c(p.logp.data(), p.logp.size() * 4)});
  }
  if (writers.comm != MPI_COMM_NULL) {
    uint64_t count = shape.size();
    MPI_Bcast(&count, 1, MPI_UINT64_T, 0, writers.comm);
    shape.resize(count);
    MPI_Bcast(shape.data(), int(count), MPI_UINT64_T, 0, writers.comm);
  }
  const bool writes = writers.rank == 0;
  Handle group = create_group(file, "in_flight");
  write_int_attribute(group.id, "ranks", (long long)(shape.size() / 5));
  for (size_t r = 0; r < shape.size() / 5; ++r) {
    const uint64_t* s = &shape[5 * r];
    Handle rank_group = create_group(group.id, rank_group_name(int(r)).c_str());
    write_checked_array(rank_group.id, "samples", H5T_STD_I64LE, H5T_NATIVE_INT64,
                        writes ? packed[r].rows.data() : nullptr,
                        {hsize_t(s[0] / kInFlightColumns), hsize_t(kInFlightColumns)},
                        uint32_t(s[2]), writers);
    write_checked_array(rank_group.id, "tokens", H5T_STD_I32LE, H5T_NATIVE_INT32,
                        writes ? packed[r].tokens.data() : nullptr, {hsize_t(s[1])}, uint32_t(s[3]),
                        writers);
    write_checked_array(rank_group.id, "behaviour_logp", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT,
                        writes ? packed[r].logp.data() : nullptr, {hsize_t(s[1])}, uint32_t(s[4]),
                        writers);
  }
}

// /placement: the EP group's shape as attributes, the slot tables [layer][slot] as a dataset, and,
// for a run that rebalances, /placement/rebalancer: its counters as attributes, the predictors'
// levels and trends [layer][expert] as datasets. Each dataset carries its CRC-32C. Collective with
// several writers (every rank passes the same placement; rank 0's values are written).
void write_placement(hid_t file, const CheckpointPlacement& p, const Writers& writers) {
  Handle group = create_group(file, "placement");
  write_int_attribute(group.id, "ep_degree", p.ep_degree);
  write_int_attribute(group.id, "slots_per_rank", p.slots_per_rank);
  std::vector<int32_t> tables;
  for (const std::vector<int>& layer : p.slot_experts)
    tables.insert(tables.end(), layer.begin(), layer.end());
  write_checked_array(
      group.id, "slot_experts", H5T_STD_I32LE, H5T_NATIVE_INT32, tables.data(),
      {hsize_t(p.slot_experts.size()), hsize_t(int64_t(p.ep_degree) * p.slots_per_rank)},
      crc32c(tables.data(), tables.size() * sizeof(int32_t)), writers);
  if (!p.has_rebalancer) return;
  const RebalancerState& r = p.rebalancer;
  Handle rebalancer = create_group(group.id, "rebalancer");
  write_int_attribute(rebalancer.id, "predictor_steps", r.predictor_steps);
  write_int_attribute(rebalancer.id, "migrations", r.migrations);
  write_double_attribute(rebalancer.id, "interval_seconds", r.interval_seconds);
  write_double_attribute(rebalancer.id, "interval_busiest_tokens", r.interval_busiest_tokens);
  for (const auto& [name, values] : {std::pair{"level", &r.level}, std::pair{"trend", &r.trend}}) {
    std::vector<double> flat;
    for (const std::vector<double>& layer : *values)
      flat.insert(flat.end(), layer.begin(), layer.end());
    const hsize_t experts = values->empty() ? 0 : hsize_t(values->front().size());
    write_checked_array(rebalancer.id, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, flat.data(),
                        {hsize_t(values->size()), experts},
                        crc32c(flat.data(), flat.size() * sizeof(double)), writers);
  }
}

// The checkpoint file at `path`: by this process alone (writers.comm null, `access` default), or
// collectively by an EP group through MPI-IO (`access` with the MPI-IO driver).
void write_checkpoint_file(const std::string& path, const ModelConfig& config,
                           const ParameterLayout& layout, const CheckpointCounters& counters,
                           const CheckpointTensors& tensors, const Writers& writers, hid_t access) {
  Handle file{H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, access), H5Fclose};
  if (file.id < 0) throw std::runtime_error("cannot create '" + path + "'");
  write_string_attribute(file.id, "format", kFormat);
  // A checkpoint is also a policy parameter file (eval --init, train --init read /parameters).
  write_string_attribute(file.id, "kind", "policy");
  write_model_attributes(file.id, config);
  write_counters(file.id, counters, writers);
  write_tensors(file.id, "parameters", config, layout, tensors.parameters, writers);
  check(H5Fflush(file.id, H5F_SCOPE_GLOBAL), "flushing " + path);
  if (writers.rank == 0) test_kill_point(counters.step, "data");
  Handle optimizer = create_group(file.id, "optimizer");
  write_tensors(optimizer.id, "first_moment", config, layout, tensors.first_moment, writers);
  write_tensors(optimizer.id, "second_moment", config, layout, tensors.second_moment, writers);
  if (tensors.reference) {
    write_tensors(file.id, "reference", config, layout, tensors.reference, writers);
  }
  // With several writers only rank 0 holds the samples; all must agree that there are some.
  int has_in_flight = tensors.in_flight ? 1 : 0;
  if (writers.comm != MPI_COMM_NULL) {
    MPI_Bcast(&has_in_flight, 1, MPI_INT, 0, writers.comm);
  }
  if (has_in_flight) {
    static const std::vector<std::vector<InFlightSample>> kNone;
    write_in_flight(file.id, tensors.in_flight ? *tensors.in_flight : kNone, writers);
  }
  if (tensors.placement) write_placement(file.id, *tensors.placement, writers);
}

// Keeps `current` and the newest checkpoint before it; removes every other checkpoint (older
// ones, and newer ones of a timeline abandoned by resuming from an earlier step) and leftovers.
void prune_checkpoints(const std::string& directory, int current) {
  int previous = -1;
  std::vector<std::pair<int, fs::path>> found;
  for (const fs::directory_entry& entry : fs::directory_iterator(directory)) {
    const std::string name = entry.path().filename().string();
    if (name.ends_with(".tmp")) {
      fs::remove(entry.path());
      continue;
    }
    const int step = step_of(name);
    if (step < 0) continue;
    found.push_back({step, entry.path()});
    if (step < current) previous = std::max(previous, step);
  }
  for (const auto& [step, path] : found) {
    if (step == current || step == previous) continue;
    fs::remove(path.string() + kSidecarSuffix);
    fs::remove(path);
  }
}

// The whole file's CRC-32C while the disk writes it back: fsync waits on the device and the CRC
// reads the file from the page cache, so they overlap (one task each). Returns the CRC once both
// are done.
uint32_t crc_while_syncing(const std::string& path, CheckpointWriteTimes& spent) {
  uint32_t crc = 0;
  tbb::task_group tasks;
  tasks.run([&] {
    const auto begin = std::chrono::steady_clock::now();
    fsync_path(path);
    spent.fsync = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  });
  const auto begin = std::chrono::steady_clock::now();
  crc = file_crc32c(path);
  spent.crc = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  tasks.wait();
  return crc;
}

}  // namespace

std::string checkpoint_path(const std::string& run_dir, int step) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%06d.h5", step);
  return checkpoint_directory(run_dir) + "/" + name;
}

namespace {

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// After the data file is complete under `temporary`: fsync it (and CRC it meanwhile), rename it
// to `path`, then its sidecar and `latest`, each atomically; prune older checkpoints.
void finish_checkpoint(const std::string& temporary, const std::string& path, int step,
                       CheckpointWriteTimes& spent) {
  const uint32_t crc = crc_while_syncing(temporary, spent);
  const uintmax_t bytes = fs::file_size(temporary);
  const double synced = seconds_now();
  durable_rename(temporary, path);
  test_kill_point(step, "renamed");
  char sidecar[96];
  std::snprintf(sidecar, sizeof sidecar, "crc32c %08x bytes %llu\n", (unsigned)crc,
                (unsigned long long)bytes);
  write_text_atomically(path + kSidecarSuffix, sidecar);
  const std::string directory = fs::path(path).parent_path().string();
  write_text_atomically(directory + "/" + kLatest, fs::path(path).filename().string() + "\n");
  prune_checkpoints(directory, step);
  spent.finish = seconds_now() - synced;
}

// Rank 0's counters on every rank of `comm` (attributes are written collectively and must be
// identical; the RL time, for one, is measured by each rank).
CheckpointCounters broadcast_counters(CheckpointCounters c, MPI_Comm comm) {
  int64_t integers[10] = {c.step,
                          c.optimizer_steps,
                          c.rl_tokens,
                          c.initial_prompts,
                          c.initial_correct,
                          c.before_rl_prompts,
                          c.before_rl_correct,
                          c.prompts,
                          c.group_size,
                          c.staleness};
  MPI_Bcast(integers, 10, MPI_INT64_T, 0, comm);
  MPI_Bcast(&c.rl_seconds, 1, MPI_DOUBLE, 0, comm);
  MPI_Bcast(&c.seed, 1, MPI_UINT64_T, 0, comm);
  c.step = int(integers[0]);
  c.optimizer_steps = int(integers[1]);
  c.rl_tokens = integers[2];
  c.initial_prompts = int(integers[3]);
  c.initial_correct = int(integers[4]);
  c.before_rl_prompts = int(integers[5]);
  c.before_rl_correct = int(integers[6]);
  c.prompts = int(integers[7]);
  c.group_size = int(integers[8]);
  c.staleness = int(integers[9]);
  c.step_rewards.resize(size_t(c.step));
  MPI_Bcast(c.step_rewards.data(), c.step, MPI_DOUBLE, 0, comm);
  return c;
}

}  // namespace

void write_checkpoint(const std::string& run_dir, const ModelConfig& config,
                      const ParameterLayout& layout, const CheckpointCounters& counters,
                      const CheckpointTensors& tensors, CheckpointWriteTimes* times) {
  if (layout.expert_sharded()) {
    throw std::invalid_argument(
        "write_checkpoint: a sharded layout needs write_checkpoint_sharded");
  }
  const double start = seconds_now();
  fs::create_directories(checkpoint_directory(run_dir));
  const std::string path = checkpoint_path(run_dir, counters.step);
  const std::string temporary = path + ".tmp";
  write_checkpoint_file(temporary, config, layout, counters, tensors, Writers{}, H5P_DEFAULT);
  CheckpointWriteTimes spent;
  spent.data = seconds_now() - start;
  finish_checkpoint(temporary, path, counters.step, spent);
  if (times) *times = spent;
}

void write_checkpoint_sharded(const std::string& run_dir, const ModelConfig& config,
                              const ParameterLayout& layout, const CheckpointCounters& counters,
                              const CheckpointTensors& tensors, MPI_Comm comm,
                              CheckpointWriteTimes* times) {
  Writers writers;
  writers.comm = comm;
  MPI_Comm_rank(comm, &writers.rank);
  int size = 1;
  MPI_Comm_size(comm, &size);
  // Every tensor of the model is written whole by the lowest rank storing it, or row by row (the
  // routed experts) by every rank storing it.
  const ParameterLayout whole_model(config);
  const std::vector<ParameterTensor>& file_tensors = whole_model.tensors();
  std::vector<char> stored(file_tensors.size()), stored_by_rank(file_tensors.size() * size_t(size));
  for (size_t i = 0; i < file_tensors.size(); ++i) {
    const ParameterTensor* own = layout.find(file_tensors[i].name);
    stored[i] = own != nullptr;
    if (own && !own->routed_expert && own->numel != file_tensors[i].numel) {
      throw std::invalid_argument("write_checkpoint_sharded: tensor " + own->name +
                                  " is not whole in this rank's layout");
    }
  }
  MPI_Allgather(stored.data(), int(stored.size()), MPI_CHAR, stored_by_rank.data(),
                int(stored.size()), MPI_CHAR, comm);
  writers.owner.assign(file_tensors.size(), -1);
  for (size_t i = 0; i < file_tensors.size(); ++i) {
    for (int r = size - 1; r >= 0; --r)
      if (stored_by_rank[size_t(r) * stored.size() + i]) writers.owner[i] = r;
    if (writers.owner[i] < 0) {
      throw std::invalid_argument("write_checkpoint_sharded: no rank stores tensor " +
                                  file_tensors[i].name);
    }
  }
  if (tensors.slot_experts) {
    // Every layer's table over the group's slots; each expert's rows come from its first replica.
    // (The ranks sharing a layer's experts: the whole group, or with pipeline stages the stage's.)
    int ep_ranks = 0;
    for (size_t i = 0; i < file_tensors.size() && ep_ranks == 0; ++i) {
      if (!file_tensors[i].routed_expert) continue;
      for (int r = 0; r < size; ++r) ep_ranks += stored_by_rank[size_t(r) * stored.size() + i];
    }
    const int slots = ep_ranks * int(layout.stored_experts());
    for (const std::vector<int>& table : *tensors.slot_experts) {
      std::vector<int> first_slot(size_t(config.n_experts), -1);
      bool valid = int(table.size()) == slots;
      for (int slot = 0; valid && slot < slots; ++slot) {
        const int e = table[size_t(slot)];
        valid = e >= 0 && e < config.n_experts;
        if (valid && first_slot[size_t(e)] < 0) first_slot[size_t(e)] = slot;
      }
      for (int slot : first_slot) valid = valid && slot >= 0;
      if (!valid) {
        throw std::invalid_argument(
            "write_checkpoint_sharded: a slot table must hold every expert in the group's " +
            std::to_string(slots) + " slots");
      }
      writers.expert_of_slot.push_back(table);
      writers.first_slot.push_back(std::move(first_slot));
    }
    if (int(writers.expert_of_slot.size()) != expert_layers(whole_model)) {
      throw std::invalid_argument("write_checkpoint_sharded: one slot table per layer");
    }
  } else if (layout.redundant_slots() > 0) {
    throw std::invalid_argument("write_checkpoint_sharded: spare expert slots need slot_experts");
  }
  const CheckpointCounters agreed = broadcast_counters(counters, comm);
  const double start = seconds_now();
  const std::string path = checkpoint_path(run_dir, agreed.step);
  const std::string temporary = path + ".tmp";
  std::string error;
  try {
    if (writers.rank == 0) fs::create_directories(checkpoint_directory(run_dir));
  } catch (const std::exception& e) {
    error = e.what();
  }
  int failed = error.empty() ? 0 : 1;
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, comm);
  CheckpointWriteTimes spent;
  if (!failed) {
    try {
#ifdef H5_HAVE_PARALLEL
      Handle access{H5Pcreate(H5P_FILE_ACCESS), H5Pclose};
      check(H5Pset_fapl_mpio(access.id, comm, MPI_INFO_NULL), "selecting MPI-IO");
      Handle transfer{H5Pcreate(H5P_DATASET_XFER), H5Pclose};
      check(H5Pset_dxpl_mpio(transfer.id, H5FD_MPIO_COLLECTIVE), "selecting collective I/O");
      writers.transfer = transfer.id;
      write_checkpoint_file(temporary, config, layout, agreed, tensors, writers, access.id);
#else
      throw std::runtime_error("this HDF5 library has no MPI-IO: sharded checkpoints need it");
#endif
    } catch (const std::exception& e) {
      error = e.what();
    }
    // Also the point after which every rank has closed the file.
    failed = error.empty() ? 0 : 1;
    MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, comm);
  }
  spent.data = seconds_now() - start;
  if (!failed && writers.rank == 0) {
    try {
      finish_checkpoint(temporary, path, agreed.step, spent);
    } catch (const std::exception& e) {
      error = e.what();
      failed = 1;
    }
  }
  MPI_Bcast(&failed, 1, MPI_INT, 0, comm);
  if (failed) {
    throw std::runtime_error("writing checkpoint '" + path +
                             "': " + (error.empty() ? "failed on another rank" : error));
  }
  if (times) *times = spent;
}

namespace {

// verify_checkpoint_file, returning the file mapped into memory (checked against its CRC-32C), so
// that a reader can take contiguous datasets from it directly.
std::unique_ptr<MappedFile> verify_and_map(const std::string& path) {
  if (!fs::exists(path)) throw ConfigError(label(path) + " does not exist");
  if (!fs::exists(path + kSidecarSuffix) && fs::exists(path + ".crc64")) {
    throw ConfigError(label(path) +
                      " was written by an older rlfusion (format 1, CRC-64 checksums); this "
                      "version reads format 2: resume with the version that wrote it, or start "
                      "a new run");
  }
  const std::string sidecar = read_text(path + kSidecarSuffix);
  unsigned crc = 0;
  unsigned long long bytes = 0;
  if (std::sscanf(sidecar.c_str(), "crc32c %8x bytes %llu", &crc, &bytes) != 2) {
    throw ConfigError(label(path) + " has no valid checksum file '" + path + kSidecarSuffix +
                      "' (its write did not complete)");
  }
  if (fs::file_size(path) != bytes) {
    throw ConfigError(label(path) + " has " + std::to_string(fs::file_size(path)) +
                      " bytes, its checksum file says " + std::to_string(bytes) +
                      " (truncated or damaged)");
  }
  auto mapped = std::make_unique<MappedFile>(path);
  if (mapped->size() != bytes || crc32c_parallel(mapped->data(), mapped->size()) != uint32_t(crc)) {
    throw ConfigError(label(path) + " does not match its CRC-32C (damaged)");
  }
  return mapped;
}

}  // namespace

void verify_checkpoint_file(const std::string& path) {
  verify_and_map(path);
}

namespace {

// The checks of check_checkpoint on an open file.
CheckpointCounters check_open_checkpoint(hid_t file, const std::string& path,
                                         const ModelConfig& config, bool with_reference) {
  const std::string format = read_string_attribute(file, "format");
  if (format != kFormat && format != kFormatWithoutPlacement) {
    throw ConfigError(label(path) + " is not an rlfusion checkpoint (format '" + format +
                      "', expected '" + kFormat + "' or '" + kFormatWithoutPlacement + "')");
  }
  const ModelConfig written = read_model_attributes(file, label(path));
  const int64_t written_total = ParameterLayout(written).total();
  const int64_t total = ParameterLayout(config).total();
  if (written_total != total || written.name != config.name) {
    throw ConfigError(label(path) + " was written for model '" + written.name + "' (" +
                      std::to_string(written_total) + " parameters), not for '" + config.name +
                      "' (" + std::to_string(total) + ")");
  }
  const bool has_reference = H5Lexists(file, "reference", H5P_DEFAULT) > 0;
  if (has_reference != with_reference) {
    throw ConfigError(label(path) + (has_reference ? " holds" : " holds no") +
                      " reference policy, but this run " + (with_reference ? "uses" : "has no") +
                      " KL term (--kl-coef): resume with the options it was written with");
  }
  return read_counters(file, path);
}

}  // namespace

CheckpointCounters check_checkpoint(const std::string& path, const ModelConfig& config,
                                    bool with_reference) {
  verify_checkpoint_file(path);
  Handle file{open_read_only(path, "checkpoint"), H5Fclose};
  return check_open_checkpoint(file.id, path, config, with_reference);
}

CheckpointCounters read_checkpoint(const std::string& path, const ModelConfig& config,
                                   const ParameterLayout& layout, const CheckpointTensors& tensors,
                                   CheckpointReadTimes* times) {
  using Clock = std::chrono::steady_clock;
  const auto begin = Clock::now();
  const std::unique_ptr<MappedFile> mapped = verify_and_map(path);
  const auto verified = Clock::now();
  if (times) times->verify = std::chrono::duration<double>(verified - begin).count();
  Handle file{open_read_only(path, "checkpoint"), H5Fclose};
  const CheckpointCounters counters =
      check_open_checkpoint(file.id, path, config, tensors.reference != nullptr);
  const std::vector<std::vector<int>>* slots = tensors.slot_experts;
  read_tensors(file.id, path, "parameters", config, layout, tensors.parameters, *mapped, slots);
  Handle optimizer = open_group(file.id, path, "optimizer");
  read_tensors(optimizer.id, path, "first_moment", config, layout, tensors.first_moment, *mapped,
               slots);
  read_tensors(optimizer.id, path, "second_moment", config, layout, tensors.second_moment, *mapped,
               slots);
  if (tensors.reference) {
    read_tensors(file.id, path, "reference", config, layout, tensors.reference, *mapped, slots);
  }
  if (times) times->data = std::chrono::duration<double>(Clock::now() - verified).count();
  return counters;
}

std::vector<InFlightSample> read_in_flight(const std::string& path, int rank) {
  Handle file{open_read_only(path, "checkpoint"), H5Fclose};
  const std::string where = label(path) + " in-flight samples of rank " + std::to_string(rank);
  const std::string name = "in_flight/" + rank_group_name(rank);
  if (H5Lexists(file.id, "in_flight", H5P_DEFAULT) <= 0 ||
      H5Lexists(file.id, name.c_str(), H5P_DEFAULT) <= 0) {
    throw ConfigError(where + " are missing");
  }
  Handle group{H5Gopen2(file.id, name.c_str(), H5P_DEFAULT), H5Gclose};
  Handle set{H5Dopen2(group.id, "samples", H5P_DEFAULT), H5Dclose};
  Handle space{H5Dget_space(set.id), H5Sclose};
  const hssize_t cells = H5Sget_simple_extent_npoints(space.id);
  if (cells < 0 || cells % kInFlightColumns != 0) throw ConfigError(where + " are damaged");
  const std::vector<int64_t> table =
      read_checked_array<int64_t>(group.id, where, "samples", H5T_NATIVE_INT64, hsize_t(cells));
  int64_t total = 0;
  try {
    total = PackedInFlight::announced_tokens(table.data(), table.size());
  } catch (const std::invalid_argument&) {
    throw ConfigError(where + " are damaged");
  }
  const std::vector<int32_t> tokens =
      read_checked_array<int32_t>(group.id, where, "tokens", H5T_NATIVE_INT32, hsize_t(total));
  const std::vector<float> logp = read_checked_array<float>(group.id, where, "behaviour_logp",
                                                            H5T_NATIVE_FLOAT, hsize_t(total));
  std::vector<InFlightSample> samples =
      PackedInFlight::unpack(table.data(), table.size(), tokens.data(), logp.data());
  return samples;
}

std::optional<CheckpointPlacement> read_checkpoint_placement(const std::string& path,
                                                             const ModelConfig& config) {
  Handle file{open_read_only(path, "checkpoint"), H5Fclose};
  if (H5Lexists(file.id, "placement", H5P_DEFAULT) <= 0) return std::nullopt;
  const std::string where = label(path) + " placement";
  Handle group = open_group(file.id, path, "placement");
  CheckpointPlacement p;
  p.ep_degree = int(read_number_attribute(group.id, where, "ep_degree"));
  p.slots_per_rank = int(read_number_attribute(group.id, where, "slots_per_rank"));
  const int layers = expert_layers(ParameterLayout(config)), experts = config.n_experts;
  if (p.ep_degree < 1 || p.slots_per_rank < 1 || p.slots_per_rank > experts) {
    throw ConfigError(where + " has EP degree " + std::to_string(p.ep_degree) + " and " +
                      std::to_string(p.slots_per_rank) + " slots per rank: the file is damaged");
  }
  const size_t slots = size_t(p.ep_degree) * size_t(p.slots_per_rank);
  const std::vector<int32_t> tables = read_checked_array<int32_t>(
      group.id, where, "slot_experts", H5T_NATIVE_INT32, hsize_t(size_t(layers) * slots));
  for (int l = 0; l < layers; ++l) {
    p.slot_experts.emplace_back(tables.begin() + long(size_t(l) * slots),
                                tables.begin() + long(size_t(l + 1) * slots));
  }
  if (H5Lexists(group.id, "rebalancer", H5P_DEFAULT) > 0) {
    p.has_rebalancer = true;
    Handle rebalancer = open_group(group.id, path, "rebalancer");
    const std::string at = where + " rebalancer";
    RebalancerState& r = p.rebalancer;
    r.predictor_steps = int(read_number_attribute(rebalancer.id, at, "predictor_steps"));
    r.migrations = int(read_number_attribute(rebalancer.id, at, "migrations"));
    r.interval_seconds = read_number_attribute(rebalancer.id, at, "interval_seconds");
    r.interval_busiest_tokens = read_number_attribute(rebalancer.id, at, "interval_busiest_tokens");
    for (const auto& [name, values] :
         {std::pair{"level", &r.level}, std::pair{"trend", &r.trend}}) {
      const std::vector<double> flat = read_checked_array<double>(
          rebalancer.id, at, name, H5T_NATIVE_DOUBLE, hsize_t(layers) * hsize_t(experts));
      for (int l = 0; l < layers; ++l) {
        values->emplace_back(flat.begin() + long(l) * experts,
                             flat.begin() + long(l + 1) * experts);
      }
    }
  }
  const std::string problem = placement_problem(p, layers, experts);
  if (!problem.empty()) throw ConfigError(where + " is inconsistent (" + problem + ")");
  return p;
}

ResumePoint find_resume_point(const std::string& resume, const std::string& run_dir) {
  ResumePoint point;
  if (resume.empty()) return point;
  if (resume != "auto") {
    verify_checkpoint_file(resume);
    point.path = resume;
    return point;
  }
  const std::string directory = checkpoint_directory(run_dir);
  if (!fs::is_directory(directory)) return point;
  std::vector<std::string> candidates;
  std::string latest = read_text(directory + "/" + kLatest);
  latest = latest.substr(0, latest.find('\n'));
  if (!latest.empty()) candidates.push_back(directory + "/" + latest);
  std::vector<std::pair<int, std::string>> by_step;
  for (const fs::directory_entry& entry : fs::directory_iterator(directory)) {
    const int step = step_of(entry.path().filename().string());
    if (step >= 0) by_step.push_back({step, entry.path().string()});
  }
  std::sort(by_step.rbegin(), by_step.rend());
  for (const auto& [step, path] : by_step) {
    if (candidates.empty() || path != candidates.front()) candidates.push_back(path);
  }
  for (const std::string& path : candidates) {
    try {
      verify_checkpoint_file(path);
      point.path = path;
      return point;
    } catch (const ConfigError& e) {
      point.skipped.push_back(e.what());
    }
  }
  return point;
}

}  // namespace rlf
