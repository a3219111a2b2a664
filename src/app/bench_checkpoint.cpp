// `rlfusion bench checkpoint`: how fast a training checkpoint (parameters + AdamW moments, the
// format of src/io/checkpoint.h) is written and read back, against `dd` moving the same number of
// bytes on the same disk in the same run: `dd if=/dev/zero of=F bs=1M conv=fsync` for writes,
// `dd if=F of=/dev/null bs=1M` for reads. The bodies run interleaved (median of --repeats), so
// drift of the disk hits both sides alike. The checkpoint's write includes everything a run pays:
// HDF5, a CRC-32C per dataset and of the whole file, fsync, the atomic rename, the sidecar and the
// `latest` marker; its read verifies the whole-file CRC before HDF5 opens the file and every
// dataset's CRC after. Reads come from the page cache on both sides (the files were just
// written). Every read checks each dataset's CRC-32C; the last one's values are also compared
// with what was written (#wrong), outside the timing.
#include <mpi.h>
#include <sys/wait.h>

#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "kernels/error.h"
#include "kernels/rng.h"
#include "src/app/bench_timing.h"
#include "src/app/build_info.h"
#include "src/app/commands.h"
#include "src/app/options.h"
#include "src/io/checkpoint.h"
#include "src/model/model_config.h"
#include "src/model/parameter_layout.h"

namespace rlf {

namespace {

namespace fs = std::filesystem;

struct CheckpointBenchOptions {
  std::string dir;
  int repeats = 3;
};

// Runs `command` through the shell; ConfigError with its text when it fails.
void run_shell(const std::string& command) {
  const int status = std::system(command.c_str());
  if (status != 0) {
    throw ConfigError("bench checkpoint: '" + command + "' failed (status " +
                      std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : status) + ")");
  }
}

std::string quoted(const std::string& path) {
  std::string out = "'";
  for (const char c : path) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Random values in every tensor; the layout's alignment padding (not stored) stays zero, as in
// the buffers read back.
void fill_random(std::vector<float>& values, const ParameterLayout& layout, uint64_t seed) {
  for (const ParameterTensor& t : layout.tensors()) {
    for (int64_t i = 0; i < t.numel; ++i) {
      values[size_t(t.offset + i)] = philox_uniform(seed, 0, uint64_t(t.offset + i)) * 2 - 1;
    }
  }
}

double gb_per_s(uintmax_t bytes, double seconds) {
  return seconds > 0 ? double(bytes) / seconds / 1e9 : 0.0;
}

}  // namespace

int run_bench_checkpoint_command(const std::vector<std::string>& args) {
  RunOptions run;
  CheckpointBenchOptions o;
  po::options_description description = run_options_description(run);
  po::options_description bench("bench checkpoint options");
  auto add = bench.add_options();
  add("dir", po::value(&o.dir)->default_value("runs/bench-checkpoint"),
      "directory on the disk to measure (created; its files are removed afterwards)");
  add("repeats", po::value(&o.repeats)->default_value(o.repeats),
      "timed repeats of each body, interleaved (median reported, >= 3)");
  description.add(bench);
  if (!parse_options("bench checkpoint", args, description, run)) return 0;

  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 1) {
    throw ConfigError("bench checkpoint measures one process's writes: run it on 1 rank, not " +
                      std::to_string(size));
  }
  if (o.repeats < 3) throw ConfigError("--repeats must be >= 3, got " + std::to_string(o.repeats));
  const std::string& dir = o.dir;
  std::error_code code;
  fs::create_directories(dir, code);
  if (code || !fs::is_directory(dir)) {
    throw ConfigError("bench checkpoint: cannot create the directory '" + dir + "'");
  }
  const ModelConfig config = load_model_config(run.model);
  const ParameterLayout layout(config);

  // The state a run checkpoints: parameters and both AdamW moments, random (incompressible).
  const size_t total = size_t(layout.total());
  std::vector<float> parameters(total), first(total), second(total);
  fill_random(parameters, layout, run.seed);
  fill_random(first, layout, run.seed + 1);
  fill_random(second, layout, run.seed + 2);
  std::vector<float> read_parameters(total), read_first(total), read_second(total);

  const std::string run_dir = dir + "/checkpoint-run";
  CheckpointCounters counters;
  counters.seed = run.seed;
  int step = 0;
  std::vector<CheckpointWriteTimes> parts;
  const auto write_body = [&] {
    counters.step = ++step;
    counters.step_rewards.assign(size_t(step), 0.5);
    CheckpointWriteTimes times;
    write_checkpoint(run_dir, config, layout, counters,
                     {parameters.data(), first.data(), second.data(), nullptr}, &times);
    parts.push_back(times);
  };
  uint64_t wrong = 0;
  std::vector<CheckpointReadTimes> read_parts;
  const auto read_body = [&] {
    CheckpointReadTimes times;
    read_checkpoint(checkpoint_path(run_dir, step), config, layout,
                    {read_parameters.data(), read_first.data(), read_second.data(), nullptr},
                    &times);
    read_parts.push_back(times);
  };
  // Outside the timed read (which checks every dataset's CRC-32C itself): the last read's values
  // against what was written.
  const auto compare_read = [&] {
    wrong += std::memcmp(read_parameters.data(), parameters.data(), total * sizeof(float)) != 0;
    wrong += std::memcmp(read_first.data(), first.data(), total * sizeof(float)) != 0;
    wrong += std::memcmp(read_second.data(), second.data(), total * sizeof(float)) != 0;
  };
  write_body();  // the size dd moves: one checkpoint file, rounded up to whole MiB
  const uintmax_t bytes = fs::file_size(checkpoint_path(run_dir, step));
  const uintmax_t mib = (bytes + (1 << 20) - 1) >> 20;
  const std::string dd_file = quoted(dir + "/dd.bin");
  const std::string dd_write = "dd if=/dev/zero of=" + dd_file +
                               " bs=1M count=" + std::to_string(mib) + " conv=fsync status=none";
  const std::string dd_read = "dd if=" + dd_file + " of=/dev/null bs=1M status=none";
  run_shell(dd_write);  // fails here, before any timing, when dd is missing or the disk is full
  parts.clear();
  read_parts.clear();

  const std::vector<double> medians = time_interleaved(
      {write_body, [&] { run_shell(dd_write); }, read_body, [&] { run_shell(dd_read); }},
      o.repeats);
  compare_read();
  fs::remove(dir + "/dd.bin", code);
  fs::remove_all(run_dir, code);

  std::vector<double> verify, read_data;
  for (const CheckpointReadTimes& t : read_parts) {
    verify.push_back(t.verify);
    read_data.push_back(t.data);
  }
  std::vector<double> data, fsync, crc, finish;
  for (const CheckpointWriteTimes& t : parts) {
    data.push_back(t.data);
    fsync.push_back(t.fsync);
    crc.push_back(t.crc);
    finish.push_back(t.finish);
  }
  const uintmax_t dd_bytes = mib << 20;
  const double write_ratio = gb_per_s(bytes, medians[0]) / gb_per_s(dd_bytes, medians[1]);
  const double read_ratio = gb_per_s(bytes, medians[2]) / gb_per_s(dd_bytes, medians[3]);

  std::printf("# rlfusion bench checkpoint: %s\n", build_info().c_str());
  std::printf(
      "# model %s: %lld parameters; checkpoint = parameters + AdamW first and second moments, "
      "%.1f MB in %s\n",
      config.name.c_str(), (long long)layout.total(), double(bytes) / 1e6, dir.c_str());
  std::printf(
      "# dd: the same size (%llu MiB) with bs=1M, conv=fsync for writes; reads from the page "
      "cache on both sides. Median of %d interleaved repeats\n#\n",
      (unsigned long long)mib, o.repeats);
  std::printf("# %-10s %12s %10s %10s %12s %10s %8s\n", "operation", "checkpoint", "time", "rate",
              "dd", "dd rate", "ratio");
  std::printf("# %-10s %12s %10s %10s %12s %10s %8s\n", "", "(MB)", "(s)", "(GB/s)", "(s)",
              "(GB/s)", "(%)");
  std::printf("  %-10s %12.1f %10.3f %10.3f %12.3f %10.3f %8.1f\n", "write", double(bytes) / 1e6,
              medians[0], gb_per_s(bytes, medians[0]), medians[1], gb_per_s(dd_bytes, medians[1]),
              100 * write_ratio);
  std::printf("  %-10s %12.1f %10.3f %10.3f %12.3f %10.3f %8.1f\n", "read", double(bytes) / 1e6,
              medians[2], gb_per_s(bytes, medians[2]), medians[3], gb_per_s(dd_bytes, medians[3]),
              100 * read_ratio);
  std::printf(
      "#\n# checkpoint write, median parts (s): HDF5 data + per-dataset CRC %.3f; fsync %.3f "
      "alongside the whole-file CRC %.3f; rename + sidecar + latest %.3f\n",
      median(data), median(fsync), median(crc), median(finish));
  std::printf(
      "# checkpoint read, median parts (s): whole-file CRC against the sidecar %.3f; HDF5 data + "
      "per-dataset CRC %.3f\n",
      median(verify), median(read_data));
  std::printf("# Read back equal to what was written: %llu wrong %s\n", (unsigned long long)wrong,
              wrong ? "FAIL" : "OK");
  std::printf("# Write: %.0f%% of dd's rate (target >= 50%%) %s\n", 100 * write_ratio,
              write_ratio >= 0.5 ? "MET" : "NOT MET");
  std::printf("# Read: %.0f%% of dd's rate (target >= 50%%) %s\n", 100 * read_ratio,
              read_ratio >= 0.5 ? "MET" : "NOT MET");
  if (run.json) {
    std::printf(
        "{\"bench\":\"checkpoint\",\"model\":\"%s\",\"bytes\":%llu,\"dd_bytes\":%llu,"
        "\"repeats\":%d,\"write_seconds\":%.6e,\"dd_write_seconds\":%.6e,\"read_seconds\":%.6e,"
        "\"dd_read_seconds\":%.6e,\"write_ratio\":%.4f,\"read_ratio\":%.4f,"
        "\"write_data_seconds\":%.6e,\"write_fsync_seconds\":%.6e,\"write_crc_seconds\":%.6e,"
        "\"write_finish_seconds\":%.6e,\"read_verify_seconds\":%.6e,"
        "\"read_data_seconds\":%.6e,\"wrong\":%llu}\n",
        config.name.c_str(), (unsigned long long)bytes, (unsigned long long)dd_bytes, o.repeats,
        medians[0], medians[1], medians[2], medians[3], write_ratio, read_ratio, median(data),
        median(fsync), median(crc), median(finish), median(verify), median(read_data),
        (unsigned long long)wrong);
  }
  return wrong ? 1 : 0;
}

}  // namespace rlf
