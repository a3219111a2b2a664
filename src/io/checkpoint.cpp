#include "src/io/checkpoint.h"

#include <tbb/parallel_for.h>
#include <tbb/task_group.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <stdexcept>

#include "kernels/error.h"
#include "src/io/durable_file.h"
#include "src/io/hdf5_helpers.h"

namespace rlf {

using namespace hdf5;
namespace fs = std::filesystem;

namespace {

// Format 2: CRC-32C checksums (format 1 had CRC-64/XZ).
constexpr const char* kFormat = "rlfusion-checkpoint-2";
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

uint32_t tensor_crc(const ParameterTensor& t, const float* data) {
  return crc32c(data + t.offset, size_t(t.numel) * sizeof(float));
}

// Every tensor of the layout from `data`, each with the CRC-32C of its bytes. The CRCs are
// computed by worker threads while this thread hands the tensors to HDF5 (which is not
// thread-safe, so it stays on one thread); the attributes follow once both are done.
void write_tensors(hid_t parent, const char* name, const ParameterLayout& layout,
                   const float* data) {
  Handle group = create_group(parent, name);
  const std::vector<ParameterTensor>& tensors = layout.tensors();
  std::vector<uint32_t> crcs(tensors.size());
  tbb::task_group checksums;
  checksums.run([&] {
    tbb::parallel_for(size_t(0), tensors.size(),
                      [&](size_t i) { crcs[i] = tensor_crc(tensors[i], data); });
  });
  try {
    for (const ParameterTensor& t : tensors)
      write_tensor(group.id, t.name, t.shape, data + t.offset);
  } catch (...) {
    checksums.wait();
    throw;
  }
  checksums.wait();
  for (size_t i = 0; i < tensors.size(); ++i) {
    Handle set{H5Dopen2(group.id, tensors[i].name.c_str(), H5P_DEFAULT), H5Dclose};
    write_u64_attribute(set.id, kCrcAttribute, crcs[i]);
  }
}

// Every tensor of the layout into `data`; each tensor's CRC-32C is checked by a worker thread
// while this thread reads the next one from HDF5.
void read_tensors(hid_t parent, const std::string& path, const char* name,
                  const ParameterLayout& layout, float* data) {
  Handle group = open_group(parent, path, name);
  const std::vector<ParameterTensor>& tensors = layout.tensors();
  std::vector<uint64_t> expected(tensors.size());
  std::vector<uint32_t> found(tensors.size());
  tbb::task_group checksums;
  try {
    for (size_t i = 0; i < tensors.size(); ++i) {
      const ParameterTensor& t = tensors[i];
      read_tensor(group.id, label(path), t.name, t.shape, data + t.offset);
      Handle set{H5Dopen2(group.id, t.name.c_str(), H5P_DEFAULT), H5Dclose};
      expected[i] = read_u64_attribute(set.id, where_in(path, name, t.name), kCrcAttribute);
      checksums.run([&, i] { found[i] = tensor_crc(tensors[i], data); });
    }
  } catch (...) {
    checksums.wait();
    throw;
  }
  checksums.wait();
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (found[i] != expected[i]) {
      throw ConfigError(where_in(path, name, tensors[i].name) +
                        " does not match its checksum: the file is damaged");
    }
  }
}

void write_step_rewards(hid_t file, const std::vector<double>& rewards) {
  const hsize_t count = rewards.size();
  Handle space{H5Screate_simple(1, &count, nullptr), H5Sclose};
  Handle set{H5Dcreate2(file, "step_rewards", H5T_IEEE_F64LE, space.id, H5P_DEFAULT, H5P_DEFAULT,
                        H5P_DEFAULT),
             H5Dclose};
  check(H5Dwrite(set.id, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, rewards.data()),
        "writing step_rewards");
  write_u64_attribute(set.id, kCrcAttribute,
                      crc32c(rewards.data(), rewards.size() * sizeof(double)));
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
  if (read_u64_attribute(set.id, label(path), kCrcAttribute) !=
      crc32c(rewards.data(), count * sizeof(double))) {
    throw ConfigError(label(path) + " dataset 'step_rewards' does not match its checksum");
  }
  return rewards;
}

void write_counters(hid_t file, const CheckpointCounters& c) {
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
  write_step_rewards(file, c.step_rewards);
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
  c.step_rewards = read_step_rewards(file, path, size_t(c.step));
  return c;
}

void write_checkpoint_file(const std::string& path, const ModelConfig& config,
                           const ParameterLayout& layout, const CheckpointCounters& counters,
                           const CheckpointTensors& tensors) {
  Handle file{H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose};
  if (file.id < 0) throw std::runtime_error("cannot create '" + path + "'");
  write_string_attribute(file.id, "format", kFormat);
  // A checkpoint is also a policy parameter file (eval --init, train --init read /parameters).
  write_string_attribute(file.id, "kind", "policy");
  write_model_attributes(file.id, config);
  write_counters(file.id, counters);
  write_tensors(file.id, "parameters", layout, tensors.parameters);
  check(H5Fflush(file.id, H5F_SCOPE_GLOBAL), "flushing " + path);
  test_kill_point(counters.step, "data");
  Handle optimizer = create_group(file.id, "optimizer");
  write_tensors(optimizer.id, "first_moment", layout, tensors.first_moment);
  write_tensors(optimizer.id, "second_moment", layout, tensors.second_moment);
  if (tensors.reference) write_tensors(file.id, "reference", layout, tensors.reference);
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

void write_checkpoint(const std::string& run_dir, const ModelConfig& config,
                      const ParameterLayout& layout, const CheckpointCounters& counters,
                      const CheckpointTensors& tensors, CheckpointWriteTimes* times) {
  const auto now = [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  const double start = now();
  const std::string directory = checkpoint_directory(run_dir);
  fs::create_directories(directory);
  const std::string path = checkpoint_path(run_dir, counters.step);
  const std::string temporary = path + ".tmp";
  write_checkpoint_file(temporary, config, layout, counters, tensors);
  const double written = now();
  CheckpointWriteTimes spent;
  spent.data = written - start;
  const uint32_t crc = crc_while_syncing(temporary, spent);
  const uintmax_t bytes = fs::file_size(temporary);
  const double synced = now();
  durable_rename(temporary, path);
  test_kill_point(counters.step, "renamed");
  char sidecar[96];
  std::snprintf(sidecar, sizeof sidecar, "crc32c %08x bytes %llu\n", (unsigned)crc,
                (unsigned long long)bytes);
  write_text_atomically(path + kSidecarSuffix, sidecar);
  write_text_atomically(directory + "/" + kLatest, fs::path(path).filename().string() + "\n");
  prune_checkpoints(directory, counters.step);
  spent.finish = now() - synced;
  if (times) *times = spent;
}

void verify_checkpoint_file(const std::string& path) {
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
  if (file_crc32c(path) != crc) {
    throw ConfigError(label(path) + " does not match its CRC-32C (damaged)");
  }
}

namespace {

// The checks of check_checkpoint on an open file.
CheckpointCounters check_open_checkpoint(hid_t file, const std::string& path,
                                         const ModelConfig& config, bool with_reference) {
  if (read_string_attribute(file, "format") != kFormat) {
    throw ConfigError(label(path) + " is not an rlfusion checkpoint (format '" +
                      read_string_attribute(file, "format") + "', expected '" + kFormat + "')");
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
                                   const ParameterLayout& layout,
                                   const CheckpointTensors& tensors) {
  verify_checkpoint_file(path);
  Handle file{open_read_only(path, "checkpoint"), H5Fclose};
  const CheckpointCounters counters =
      check_open_checkpoint(file.id, path, config, tensors.reference != nullptr);
  read_tensors(file.id, path, "parameters", layout, tensors.parameters);
  Handle optimizer = open_group(file.id, path, "optimizer");
  read_tensors(optimizer.id, path, "first_moment", layout, tensors.first_moment);
  read_tensors(optimizer.id, path, "second_moment", layout, tensors.second_moment);
  if (tensors.reference) read_tensors(file.id, path, "reference", layout, tensors.reference);
  return counters;
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
