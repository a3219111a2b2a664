// trace.h5 written collectively by every rank (parallel HDF5 and gather-to-rank-0) and read back
// exactly on rank 0: counts, phases, times, tokens, bytes, versions, memory, metadata.
#include <gtest/gtest.h>
#include <mpi.h>
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <vector>

#include "src/io/trace.h"
#include "src/io/trace_reader.h"
#include "src/io/trace_summary.h"
#include "src/io/trace_writer.h"

namespace rlf {
namespace {

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int world_size() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// Rank 1 records nothing (an empty dataset); every other rank r records r + 2 events that no
// other rank has: phase, times, tokens, bytes, version and memory all depend on (r, i).
std::vector<TraceEvent> events_of(int rank) {
  std::vector<TraceEvent> events;
  const int count = rank == 1 ? 0 : rank + 2;
  for (int i = 0; i < count; ++i) {
    TraceEvent e;
    e.phase = Phase((rank + i) % kPhaseCount);
    e.begin = i + 0.25 * rank;
    e.end = e.begin + 0.5 + 0.001 * rank;
    e.tokens = 1000 * rank + i;
    e.bytes = (int64_t(1) << 40) + 7 * rank + 3 * i;
    e.version = i % 2 == 0 ? i / 2 : kNoVersion;
    e.memory_bytes = 1024 * rank + i;
    events.push_back(e);
  }
  return events;
}

// Trained samples: rank r records 3 r + 1 of them (so rank 0 has one and the counts differ from
// the events'), every field a function of (r, i).
std::vector<TrainedSample> samples_of(int rank) {
  std::vector<TrainedSample> samples;
  for (int i = 0; i < 3 * rank + 1; ++i) {
    samples.push_back({(int64_t(1) << 35) + 100 * rank + i, rank + i, rank + 2 * i, 7 * rank + i,
                       11 + i, 3 * rank + i});
  }
  return samples;
}

// A fresh directory made by rank 0, its path broadcast to every rank.
std::string shared_temp_dir() {
  std::string path;
  if (world_rank() == 0) {
    std::string pattern = (std::filesystem::temp_directory_path() / "rlfusion-mpi-trace-XXXXXX");
    path = mkdtemp(pattern.data()) ? pattern : "";
  }
  int length = int(path.size());
  MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD);
  path.resize(size_t(length));
  MPI_Bcast(path.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD);
  return path;
}

// Rank r's routing log: r values (none on rank 0), so ranks differ in length.
std::vector<int32_t> routing_of(int rank) {
  std::vector<int32_t> routing;
  for (int i = 0; i < rank; ++i) routing.push_back(int32_t(1000 * rank - 7 * i));
  return routing;
}

void check_trace(const std::string& path) {
  const TraceData trace = read_trace(path);
  EXPECT_EQ(trace.world_size, world_size());
  ASSERT_EQ(int(trace.ranks.size()), world_size());
  EXPECT_EQ(trace.metadata.at("command"), "mpi-test");
  EXPECT_EQ(trace.metadata.at("from_rank"), "0");  // rank 0's metadata is the one written
  for (int r = 0; r < world_size(); ++r) {
    const std::vector<TraceEvent> expected = events_of(r);
    const std::vector<TraceEvent>& got = trace.ranks[size_t(r)];
    ASSERT_EQ(got.size(), expected.size()) << "rank " << r;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].phase, expected[i].phase) << "rank " << r << " event " << i;
      EXPECT_EQ(got[i].begin, expected[i].begin) << "rank " << r << " event " << i;
      EXPECT_EQ(got[i].end, expected[i].end) << "rank " << r << " event " << i;
      EXPECT_EQ(got[i].tokens, expected[i].tokens) << "rank " << r << " event " << i;
      EXPECT_EQ(got[i].bytes, expected[i].bytes) << "rank " << r << " event " << i;
      EXPECT_EQ(got[i].version, expected[i].version) << "rank " << r << " event " << i;
      EXPECT_EQ(got[i].memory_bytes, expected[i].memory_bytes) << "rank " << r << " event " << i;
    }
    const std::vector<TrainedSample> want_samples = samples_of(r);
    const std::vector<TrainedSample>& got_samples = trace.samples[size_t(r)];
    ASSERT_EQ(got_samples.size(), want_samples.size()) << "rank " << r;
    for (size_t i = 0; i < got_samples.size(); ++i) {
      EXPECT_EQ(got_samples[i].sample_id, want_samples[i].sample_id) << "rank " << r;
      EXPECT_EQ(got_samples[i].version_min, want_samples[i].version_min) << "rank " << r;
      EXPECT_EQ(got_samples[i].version_max, want_samples[i].version_max) << "rank " << r;
      EXPECT_EQ(got_samples[i].trained_version, want_samples[i].trained_version) << "rank " << r;
      EXPECT_EQ(got_samples[i].prompt_tokens, want_samples[i].prompt_tokens) << "rank " << r;
      EXPECT_EQ(got_samples[i].response_tokens, want_samples[i].response_tokens) << "rank " << r;
    }
    EXPECT_EQ(trace.routing[size_t(r)], routing_of(r)) << "rank " << r;
  }
  // Every rank's breakdown covers the same wall time exactly.
  const TraceSummary summary = summarize(trace);
  ASSERT_EQ(int(summary.ranks.size()), world_size());
  for (const RankBreakdown& rank : summary.ranks) {
    double sum = 0;
    for (double s : rank.seconds) sum += s;
    EXPECT_NEAR(sum, summary.wall(), 1e-12) << "rank " << rank.rank;
  }
}

TEST(MpiTrace, EveryRanksEventsTrainedSamplesAndRoutingLandInTraceH5Exactly) {
  const std::string dir = shared_temp_dir();
  ASSERT_FALSE(dir.empty());
  TraceRecorder recorder(MPI_COMM_WORLD);
  EXPECT_GE(recorder.now(), 0.0);
  for (const TraceEvent& e : events_of(world_rank())) recorder.record(e);
  for (const TrainedSample& s : samples_of(world_rank())) {
    recorder.record_trained(s.sample_id, s.version_min, s.version_max, s.trained_version,
                            s.prompt_tokens, s.response_tokens);
  }
  recorder.set_routing(routing_of(world_rank()));
  const std::map<std::string, std::string> metadata = {{"command", "mpi-test"},
                                                       {"from_rank", std::to_string(world_rank())}};

  std::vector<TraceWriteMode> modes = {TraceWriteMode::Auto, TraceWriteMode::GatherToRoot};
  if (parallel_hdf5_available()) modes.push_back(TraceWriteMode::Parallel);
  for (TraceWriteMode mode : modes) {
    const std::string path = dir + "/trace-" + std::to_string(int(mode)) + ".h5";
    write_trace(path, recorder, MPI_COMM_WORLD, metadata, mode);
    // write_trace returns on every rank once the file is in place under its final name.
    EXPECT_TRUE(std::filesystem::exists(path)) << path;
    if (world_rank() == 0) {
      EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
      check_trace(path);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  if (world_rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace rlf
