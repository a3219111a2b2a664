// Trace recording, trace.h5 written and read by one process, the report's computations, and
// `rlfusion report` end to end on a trace this test writes. (Many-rank files: tests/mpi.)
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/arena.h"
#include "kernels/error.h"
#include "src/io/trace.h"
#include "src/io/trace_reader.h"
#include "src/io/trace_summary.h"
#include "src/io/trace_writer.h"
#include "tests/app/run_rlfusion.h"

namespace rlf {
namespace {

// app_tests runs without mpiexec and its main (gtest_main) does not initialize MPI. Tests that
// need MPI call ensure_mpi(), which initializes it once as a singleton; the environment finalizes
// it after the last test. Other tests never start MPI, so the binaries they launch inherit no
// MPI state.
bool g_mpi_initialized_here = false;

void ensure_mpi() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  // Singleton MPI_Init refuses to run as root without these (as mpiexec does).
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  g_mpi_initialized_here = true;
}

class MpiEnvironment : public ::testing::Environment {
 public:
  void TearDown() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (g_mpi_initialized_here && !finalized) MPI_Finalize();
  }
};
[[maybe_unused]] ::testing::Environment* const kMpiEnvironment =
    ::testing::AddGlobalTestEnvironment(new MpiEnvironment);

std::string temp_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("rlfusion-test-" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

TraceEvent event(Phase phase, double begin, double end, int32_t version = kNoVersion,
                 int64_t tokens = 0, int64_t bytes = 0, int64_t memory_bytes = 0) {
  return {phase, begin, end, tokens, bytes, version, memory_bytes};
}

void expect_same_events(const std::vector<TraceEvent>& a, const std::vector<TraceEvent>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].phase, b[i].phase) << i;
    EXPECT_EQ(a[i].begin, b[i].begin) << i;
    EXPECT_EQ(a[i].end, b[i].end) << i;
    EXPECT_EQ(a[i].tokens, b[i].tokens) << i;
    EXPECT_EQ(a[i].bytes, b[i].bytes) << i;
    EXPECT_EQ(a[i].version, b[i].version) << i;
    EXPECT_EQ(a[i].memory_bytes, b[i].memory_bytes) << i;
  }
}

// --- recorder --------------------------------------------------------------------------------

TEST(TraceRecorder, DisabledRecorderRecordsNothing) {
  TraceRecorder recorder;
  EXPECT_FALSE(recorder.enabled());
  {
    TraceScope scope(recorder, Phase::Train);
    scope.set_tokens(5);
  }
  recorder.record(Phase::Generate, 0, 1);
  recorder.record(event(Phase::Other, 0, 1));
  EXPECT_TRUE(recorder.events().empty());
}

TEST(TraceRecorder, ScopesRecordAtDestructionWithTheirCountsAndNest) {
  ensure_mpi();
  Arena arena("device", 1 << 20);
  TraceRecorder recorder(MPI_COMM_SELF, 16);
  recorder.set_memory_source(&arena);
  const double start = recorder.now();
  EXPECT_GE(start, 0.0);
  {
    TraceScope outer(recorder, Phase::Train);
    outer.set_version(3);
    outer.set_tokens(100);
    outer.add_tokens(20);
    arena.allocate_bytes(4096, "activations");
    {
      TraceScope inner(recorder, Phase::GradientReduce);
      inner.set_bytes(1000);
      inner.add_bytes(24);
      inner.set_memory_bytes(7);
    }
    EXPECT_EQ(recorder.events().size(), 1u);  // the inner scope has ended, the outer not yet
  }
  ASSERT_EQ(recorder.events().size(), 2u);
  const TraceEvent& inner = recorder.events()[0];
  const TraceEvent& outer = recorder.events()[1];
  EXPECT_EQ(inner.phase, Phase::GradientReduce);
  EXPECT_EQ(inner.bytes, 1024);
  EXPECT_EQ(inner.memory_bytes, 7);  // explicit memory wins over the source
  EXPECT_EQ(inner.version, kNoVersion);
  EXPECT_EQ(outer.phase, Phase::Train);
  EXPECT_EQ(outer.tokens, 120);
  EXPECT_EQ(outer.version, 3);
  EXPECT_EQ(outer.memory_bytes, int64_t(arena.used()));
  EXPECT_LE(start, outer.begin);
  EXPECT_LE(outer.begin, inner.begin);
  EXPECT_LE(inner.begin, inner.end);
  EXPECT_LE(inner.end, outer.end);
  EXPECT_LE(outer.end, recorder.now());
}

TEST(TraceRecorder, RecordingWithinTheReservationNeverReallocates) {
  ensure_mpi();
  TraceRecorder recorder(MPI_COMM_SELF, 1000);
  ASSERT_GE(recorder.events().capacity(), 1000u);
  const TraceEvent* storage = recorder.events().data();
  for (int i = 0; i < 1000; ++i) {
    TraceScope scope(recorder, Phase(i % kPhaseCount));
    scope.set_tokens(i);
  }
  EXPECT_EQ(recorder.events().data(), storage);
  EXPECT_EQ(recorder.events().size(), 1000u);
  recorder.record(Phase::Other, 1, 2);  // past the reservation: grows, keeps every event
  EXPECT_EQ(recorder.events().size(), 1001u);
  EXPECT_EQ(recorder.events()[999].tokens, 999);
}

TEST(TraceRecorder, PhaseNamesAreDistinct) {
  std::vector<std::string> names;
  for (int p = 0; p < kPhaseCount; ++p) names.push_back(phase_name(Phase(p)));
  EXPECT_EQ(names.front(), "generate");
  EXPECT_EQ(names[size_t(Phase::QueuePut)], "queue_put");
  std::sort(names.begin(), names.end());
  EXPECT_EQ(std::unique(names.begin(), names.end()), names.end());
}

// --- time breakdown and steps ----------------------------------------------------------------

double at(const std::array<double, kTimeCategoryCount>& s, TimeCategory c) {
  return s[size_t(c)];
}

TEST(TraceBreakdown, NestedEventsCountOnceAndUncoveredTimeIsIdle) {
  const std::vector<TraceEvent> events = {
      event(Phase::Generate, 0, 4),
      event(Phase::WeightSync, 5, 6),  // nested inside the Train event below
      event(Phase::GradientReduce, 6.5, 7),
      event(Phase::Train, 4, 8),
      event(Phase::QueuePut, 8, 8.5),
      event(Phase::Idle, 9, 9.5),  // explicit waiting is idle too
      event(Phase::Score, 9.5, 10),
  };
  const auto s = time_breakdown(events, 0, 10);
  EXPECT_DOUBLE_EQ(at(s, TimeCategory::Generate), 4);
  EXPECT_DOUBLE_EQ(at(s, TimeCategory::Train), 3);  // 4..8 less the nested weight sync
  EXPECT_DOUBLE_EQ(at(s, TimeCategory::Communication), 1);
  EXPECT_DOUBLE_EQ(at(s, TimeCategory::Queue), 0.5);
  EXPECT_DOUBLE_EQ(at(s, TimeCategory::Other), 0.5);
  EXPECT_DOUBLE_EQ(at(s, TimeCategory::Idle), 1.0);  // 8.5..9 uncovered + 9..9.5 idle
  double sum = 0;
  for (double x : s) sum += x;
  EXPECT_DOUBLE_EQ(sum, 10);
}

TEST(TraceBreakdown, WindowClipsEventsAndAnEmptyRankIsAllIdle) {
  const std::vector<TraceEvent> events = {event(Phase::Generate, -1, 2), event(Phase::Train, 3, 7)};
  const auto s = time_breakdown(events, 0, 5);
  EXPECT_DOUBLE_EQ(at(s, TimeCategory::Generate), 2);
  EXPECT_DOUBLE_EQ(at(s, TimeCategory::Train), 2);
  EXPECT_DOUBLE_EQ(at(s, TimeCategory::Idle), 1);
  const auto empty = time_breakdown({}, 0, 5);
  EXPECT_DOUBLE_EQ(at(empty, TimeCategory::Idle), 5);
  // Overlapping (not nested) events: each instant goes to the one begun last.
  const auto overlap =
      time_breakdown({event(Phase::Generate, 0, 3), event(Phase::QueueGet, 2, 4)}, 0, 4);
  EXPECT_DOUBLE_EQ(at(overlap, TimeCategory::Generate), 2);
  EXPECT_DOUBLE_EQ(at(overlap, TimeCategory::Queue), 2);
}

TEST(TraceSummary, StepWallTimesRunFromOneStepEndToTheNextAcrossRanks) {
  TraceData trace;
  trace.world_size = 2;
  trace.ranks = {
      {event(Phase::Generate, 0, 2, 0, 50), event(Phase::Generate, 2, 5, 1, 60),
       event(Phase::Evaluate, 9, 10)},
      {event(Phase::Train, 2, 3, 0, 300), event(Phase::Optimizer, 3, 4, 0, 999),
       event(Phase::Train, 5, 7, 1, 500), event(Phase::GradientReduce, 7, 8, 1)},
  };
  const TraceSummary s = summarize(trace);
  EXPECT_DOUBLE_EQ(s.begin, 0);
  EXPECT_DOUBLE_EQ(s.end, 10);
  ASSERT_EQ(s.steps.size(), 2u);
  EXPECT_EQ(s.steps[0].version, 0);
  EXPECT_DOUBLE_EQ(s.steps[0].wall(), 4);  // first event of version 0 .. its optimizer's end
  EXPECT_EQ(s.steps[0].tokens, 300);       // Train tokens only
  EXPECT_EQ(s.steps[1].version, 1);
  EXPECT_DOUBLE_EQ(s.steps[1].wall(), 4);  // 4 .. 8, though its generation began at 2
  EXPECT_DOUBLE_EQ(s.steps[1].tokens_per_second(), 125);
  EXPECT_DOUBLE_EQ(s.total.wall(), 8);
  EXPECT_EQ(s.total.tokens, 800);
  // Inside each step's window, the busiest rank's generate and train seconds: step 0 [0, 4) has
  // rank 0 generating 0..2 and version 1's 2..4, rank 1 training 2..4 (its optimizer too); step 1
  // [4, 8) rank 0 generating 4..5, rank 1 training 5..7 and reducing its gradients 7..8.
  EXPECT_DOUBLE_EQ(s.steps[0].generate_seconds, 4);
  EXPECT_DOUBLE_EQ(s.steps[0].train_seconds, 2);
  EXPECT_DOUBLE_EQ(s.steps[1].generate_seconds, 1);
  EXPECT_DOUBLE_EQ(s.steps[1].train_seconds, 3);
  // The generation phases' wall: here no event is nested in them, so the same seconds.
  EXPECT_DOUBLE_EQ(s.steps[0].generate_phase_seconds, 4);
  EXPECT_DOUBLE_EQ(s.steps[1].generate_phase_seconds, 1);
  ASSERT_EQ(s.ranks.size(), 2u);
  EXPECT_DOUBLE_EQ(s.ranks[0].seconds[size_t(TimeCategory::Idle)], 4);
  EXPECT_DOUBLE_EQ(s.ranks[1].seconds[size_t(TimeCategory::Train)], 5);
  ASSERT_EQ(s.phases.size(), 5u);
  EXPECT_EQ(s.phases[0].phase, Phase::Generate);
  EXPECT_EQ(s.phases[0].tokens, 110);
}

// A generation phase's long-tail bubble is an Idle event nested at its end: the generate category
// leaves it out, the phase's wall keeps it (what the planner's generation part predicts). Each the
// busiest rank's.
TEST(TraceSummary, GenerationPhaseWallKeepsTheNestedTailBubble) {
  TraceData trace;
  trace.world_size = 2;
  trace.ranks = {
      {event(Phase::Generate, 0, 4, 0), event(Phase::Idle, 3, 4, 0), event(Phase::Train, 4, 6, 0),
       event(Phase::Generate, 6, 9, 1), event(Phase::Idle, 7.5, 9, 1),
       event(Phase::Train, 9, 10, 1)},
      {event(Phase::Generate, 0, 3.5, 0), event(Phase::Idle, 3.5, 4, 0),
       event(Phase::Train, 4, 6, 0), event(Phase::Generate, 6, 8, 1),
       event(Phase::Train, 9, 10, 1)},
  };
  const TraceSummary s = summarize(trace);
  ASSERT_EQ(s.steps.size(), 2u);
  EXPECT_DOUBLE_EQ(s.steps[0].generate_seconds, 3.5);      // rank 1: no bubble nested
  EXPECT_DOUBLE_EQ(s.steps[0].generate_phase_seconds, 4);  // rank 0: 3 + its bubble's 1
  EXPECT_DOUBLE_EQ(s.steps[1].wall(), 4);                  // 6 .. 10
  EXPECT_DOUBLE_EQ(s.steps[1].generate_seconds, 2);        // rank 1's 6 .. 8
  EXPECT_DOUBLE_EQ(s.steps[1].generate_phase_seconds, 3);  // rank 0's 6 .. 9
}

// --- trace.h5, one process -------------------------------------------------------------------

// The trace the report test reads: one rank, two RL steps, every time category.
TraceRecorder example_recorder() {
  TraceRecorder recorder(MPI_COMM_SELF);
  const int64_t MiB = 1 << 20;
  for (const TraceEvent& e : {
           event(Phase::Generate, 0, 2, 0, 64),
           event(Phase::Train, 2, 3, 0, 300, 0, 32 * MiB),
           event(Phase::Optimizer, 3, 3.5, 0),
           event(Phase::WeightSync, 3.5, 4, 1, 0, 4096),
           event(Phase::Generate, 4, 5.5, 1, 80),
           event(Phase::GradientReduce, 5.75, 5.875, 1, 0, 1000),
           event(Phase::Train, 5.5, 6, 1, 400, 0, 64 * MiB),
           event(Phase::Optimizer, 6, 6.5, 1),
           event(Phase::QueuePut, 6.5, 7, kNoVersion, 0, 2048),
           event(Phase::Idle, 7.5, 8),
           event(Phase::Evaluate, 8, 9),
       }) {
    recorder.record(e);
  }
  return recorder;
}

TEST(TraceFile, OneRankRoundTripsExactlyInEveryWriteMode) {
  ensure_mpi();
  const std::string dir = temp_dir("trace-roundtrip");
  const TraceRecorder recorder = example_recorder();
  std::vector<TraceWriteMode> modes = {TraceWriteMode::Auto, TraceWriteMode::GatherToRoot};
  if (parallel_hdf5_available()) modes.push_back(TraceWriteMode::Parallel);
  for (TraceWriteMode mode : modes) {
    const std::string path = dir + "/trace.h5";
    write_trace(path, recorder, MPI_COMM_SELF, {{"command", "test"}, {"mode", "fused"}}, mode);
    EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
    const TraceData trace = read_trace(path);
    EXPECT_EQ(trace.world_size, 1);
    ASSERT_EQ(trace.ranks.size(), 1u);
    expect_same_events(trace.ranks[0], recorder.events());
    EXPECT_EQ(trace.metadata.at("command"), "test");
    EXPECT_EQ(trace.metadata.at("mode"), "fused");
    EXPECT_EQ(trace.metadata.count("format"), 0u);
  }
  EXPECT_THROW(write_trace(dir + "/x.h5", recorder, MPI_COMM_SELF, {{"world_size", "3"}}),
               std::invalid_argument);
}

TEST(TraceFile, MissingDamagedOrForeignFilesAreConfigErrorsNamingThePath) {
  const std::string dir = temp_dir("trace-bad");
  auto expect_error = [](const std::string& path, const std::string& text) {
    try {
      read_trace(path);
      ADD_FAILURE() << "no error for " << path;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  expect_error(dir + "/none.h5", "does not exist");
  std::ofstream(dir + "/garbage.h5") << "not an HDF5 file at all";
  expect_error(dir + "/garbage.h5", "not an HDF5 file");
  const hid_t file =
      H5Fcreate((dir + "/empty.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  H5Fclose(file);
  expect_error(dir + "/empty.h5", "not an rlfusion trace");
}

TEST(TraceFile, ATruncatedTraceIsAConfigError) {
  ensure_mpi();
  const std::string dir = temp_dir("trace-truncated");
  write_trace(dir + "/trace.h5", example_recorder(), MPI_COMM_SELF, {});
  const auto size = std::filesystem::file_size(dir + "/trace.h5");
  std::filesystem::resize_file(dir + "/trace.h5", size / 2);
  EXPECT_THROW(read_trace(dir + "/trace.h5"), ConfigError);
}

// --- rlfusion report, end to end -------------------------------------------------------------

using Result = test::CommandResult;
using test::run_rlfusion;

// The report's tables: runs of data lines (not starting with '#'), split into words; a '#' line
// ends a table.
std::vector<std::vector<std::vector<std::string>>> tables_of(const std::string& text) {
  std::vector<std::vector<std::vector<std::string>>> tables;
  bool in_table = false;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') {
      in_table = false;
      continue;
    }
    if (!in_table) tables.emplace_back();
    in_table = true;
    std::istringstream words(line);
    std::vector<std::string> row;
    for (std::string w; words >> w;) row.push_back(w);
    tables.back().push_back(row);
  }
  return tables;
}

void expect_row(const std::vector<std::string>& row, const std::vector<double>& expected,
                double tolerance) {
  ASSERT_EQ(row.size(), expected.size() + 1) << row[0];
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(std::stod(row[i + 1]), expected[i], tolerance) << row[0] << " column " << i + 1;
  }
}

TEST(ReportCommand, PrintsThroughputBreakdownAndBytesOfAWrittenTrace) {
  ensure_mpi();
  const std::string dir = temp_dir("report");
  write_trace(dir + "/trace.h5", example_recorder(), MPI_COMM_SELF, {{"command", "test"}});

  const Result r = run_rlfusion("report " + dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto tables = tables_of(r.output);
  ASSERT_EQ(tables.size(), 3u) << r.output;

  // Throughput: version 0 runs 0..3.5 s, version 1 from 3.5 s to its optimizer's end at 6.5 s.
  const auto& steps = tables[0];
  ASSERT_EQ(steps.size(), 3u) << r.output;
  EXPECT_EQ(steps[0][0], "0");
  expect_row(steps[0], {3.5, 300, 300 / 3.5}, 0.05);
  EXPECT_EQ(steps[1][0], "1");
  expect_row(steps[1], {3.0, 400, 400 / 3.0}, 0.05);
  EXPECT_EQ(steps[2][0], "total");
  expect_row(steps[2], {6.5, 700, 700 / 6.5}, 0.05);

  // Breakdown over the 9 s wall: generate 3.5, train 2.5 (train, optimizer, gradient reduce),
  // queue 0.5, communication 0.5, other 1 (evaluate), idle 1 (a gap and an idle event); then the
  // memory peak in MiB.
  const auto& ranks = tables[1];
  ASSERT_EQ(ranks.size(), 1u) << r.output;
  EXPECT_EQ(ranks[0][0], "0");
  expect_row(ranks[0],
             {3.5, 100 * 3.5 / 9, 2.5, 100 * 2.5 / 9, 0.5, 100 * 0.5 / 9, 0.5, 100 * 0.5 / 9, 1,
              100 / 9.0, 1, 100 / 9.0, 64},
             0.051);
  EXPECT_NE(r.output.find("# verdict: idle (bubble) fraction mean 11.1%, max 11.1% on rank 0; "
                          "most rank-time in generate (38.9%)"),
            std::string::npos)
      << r.output;

  // Bytes per phase: events, time, tokens, bytes, GB/s.
  const auto& phases = tables[2];
  std::map<std::string, std::vector<std::string>> by_phase;
  for (const auto& row : phases) by_phase[row[0]] = row;
  ASSERT_EQ(by_phase.size(), 8u) << r.output;
  expect_row(by_phase["generate"], {2, 3.5, 144, 0, 0}, 1e-6);
  expect_row(by_phase["train"], {2, 1.5, 700, 0, 0}, 1e-6);
  expect_row(by_phase["weight_sync"], {1, 0.5, 0, 4096, 4096 / 0.5 / 1e9}, 1e-3);
  expect_row(by_phase["gradient_reduce"], {1, 0.125, 0, 1000, 0}, 1e-3);
  expect_row(by_phase["queue_put"], {1, 0.5, 0, 2048, 0}, 1e-3);

  const Result json = run_rlfusion("report " + dir + " --json");
  ASSERT_EQ(json.exit_code, 0) << json.output;
  for (const char* text :
       {"\"world_size\":1", "\"wall_s\":9,", "\"metadata\":{\"command\":\"test\"}",
        "{\"version\":1,\"wall_s\":3,\"tokens\":400,", "\"generate_s\":3.5,", "\"idle_s\":1,",
        "\"memory_peak_bytes\":67108864",
        "{\"phase\":\"weight_sync\",\"events\":1,\"seconds\":0.5,\"tokens\":0,\"bytes\":4096}"}) {
    EXPECT_NE(json.output.find(text), std::string::npos) << text << "\n" << json.output;
  }

  const Result csv = run_rlfusion("report " + dir + " --csv");
  ASSERT_EQ(csv.exit_code, 0) << csv.output;
  EXPECT_EQ(csv.output.rfind("rank,wall_s,generate_s,generate_pct,train_s,", 0), 0u) << csv.output;
  EXPECT_NE(csv.output.find("\n0,9,3.5,38.8888"), std::string::npos) << csv.output;
}

TEST(ReportCommand, LinkTrafficRoundTripsAndShowsPerRank) {
  ensure_mpi();
  const std::string dir = temp_dir("report-links");
  TraceRecorder recorder = example_recorder();
  recorder.set_link_traffic({{0, 5000, 7}, {1, 1234, 3}});
  write_trace(dir + "/trace.h5", recorder, MPI_COMM_SELF, {});
  const TraceData trace = read_trace(dir + "/trace.h5");
  ASSERT_EQ(trace.links.size(), 1u);
  ASSERT_EQ(trace.links[0].size(), 2u);
  EXPECT_EQ(trace.links[0][1].link_class, 1);
  EXPECT_EQ(trace.links[0][1].bytes, 1234);
  EXPECT_EQ(trace.links[0][1].messages, 3);

  const Result r = run_rlfusion("report " + dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto tables = tables_of(r.output);
  ASSERT_EQ(tables.size(), 4u) << r.output;  // steps, breakdown, links, phases
  ASSERT_EQ(tables[2].size(), 2u) << r.output;
  expect_row(tables[2][0], {5000, 7, 1234, 3}, 0);
  EXPECT_EQ(tables[2][1][0], "total");

  const Result json = run_rlfusion("report " + dir + " --json");
  EXPECT_NE(json.output.find("\"intra_node_bytes\":5000,\"intra_node_messages\":7,"
                             "\"inter_node_bytes\":1234,\"inter_node_messages\":3"),
            std::string::npos)
      << json.output;
  const Result csv = run_rlfusion("report " + dir + " --csv");
  EXPECT_NE(csv.output.find(",67108864,5000,1234\n"), std::string::npos) << csv.output;
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t count = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++count;
  return count;
}

TEST(ReportCommand, ChromeTimelineHasASliceForEveryEventAndCounters) {
  ensure_mpi();
  const std::string dir = temp_dir("report-chrome");
  write_trace(dir + "/trace.h5", example_recorder(), MPI_COMM_SELF, {{"command", "test"}});
  const std::string timeline = dir + "/timeline.json";
  const Result r = run_rlfusion("report " + dir + " --json --chrome " + timeline);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(std::filesystem::exists(timeline + ".tmp"));
  std::ifstream file(timeline);
  const std::string json((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  // One complete slice per event (11), named after its phase, on the phase's track.
  EXPECT_EQ(count_of(json, "\"ph\":\"X\""), 11u) << json;
  EXPECT_EQ(count_of(json, "\"ph\":\"X\",\"name\":\"generate\""), 2u);
  EXPECT_NE(json.find("{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":0,\"args\":{\"name\":"
                      "\"rank 0\"}}"),
            std::string::npos);
  // The version-1 training slice: 5.5 s .. 6 s, 400 tokens.
  EXPECT_NE(json.find("\"name\":\"train\",\"cat\":\"train\",\"pid\":0,\"tid\":3,"
                      "\"ts\":5500000.000,\"dur\":500000.000,\"args\":{\"tokens\":400,"
                      "\"bytes\":0,\"version\":1}"),
            std::string::npos)
      << json;
  // Counters: memory at the two training events' ends; bytes moved accumulate to 7144.
  EXPECT_EQ(count_of(json, "\"name\":\"device memory\""), 2u);
  EXPECT_NE(json.find("\"args\":{\"MiB\":64.000}"), std::string::npos);
  EXPECT_EQ(count_of(json, "\"name\":\"bytes moved\""), 3u);
  EXPECT_NE(json.find("\"args\":{\"MB\":0.007}"), std::string::npos);
  EXPECT_NE(json.find("\"otherData\":{\"command\":\"test\"}"), std::string::npos);
  EXPECT_EQ(count_of(json, "{"), count_of(json, "}"));
  EXPECT_EQ(count_of(json, "["), count_of(json, "]"));
  // The JSON twin on stdout stays the report alone.
  EXPECT_NE(r.output.find("{\"command\":\"report\""), std::string::npos);

  const Result bad = run_rlfusion("report " + dir + " --chrome " + dir + "/no-such-dir/t.json");
  EXPECT_EQ(bad.exit_code, kExitConfigError) << bad.output;
  EXPECT_NE(bad.output.find("no-such-dir"), std::string::npos) << bad.output;
}

// jobs/plot/plot_run.py on a trace this test writes: three PNGs; a directory without a trace
// exits with 2. Needs Debian's python3-h5py and python3-matplotlib (`make plots`, CI installs
// them); skipped without them.
TEST(PlotScripts, PlotRunWritesThroughputBreakdownAndTimelinePngs) {
  if (std::system("/usr/bin/python3 -c 'import h5py, matplotlib' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "no /usr/bin/python3 with h5py and matplotlib (make plots installs them)";
  }
  ensure_mpi();
  const std::string dir = temp_dir("plots");
  write_trace(dir + "/trace.h5", example_recorder(), MPI_COMM_SELF,
              {{"command", "train"}, {"model", "tiny"}, {"task", "sort"}});
  const auto plot = [](const std::string& args) {
    return test::run_in_source_tree("/usr/bin/python3 jobs/plot/plot_run.py " + args +
                                    " --rlfusion " RLFUSION_BINARY);
  };
  const Result r = plot(dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* name : {"throughput.png", "breakdown.png", "timeline.png"}) {
    std::ifstream png(dir + "/" + name, std::ios::binary);
    char magic[8] = {};
    png.read(magic, 8);
    EXPECT_EQ(std::string(magic + 1, 3), "PNG") << name;
    EXPECT_GT(std::filesystem::file_size(dir + "/" + name), 5000u) << name;
  }
  const Result missing = plot(dir + "/no-such-run");
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find("no-such-run"), std::string::npos) << missing.output;
}

TEST(ReportCommand, MissingDirectoryOrTraceExitsWith2NamingThePath) {
  const std::string dir = temp_dir("report-bad");
  const Result missing = run_rlfusion("report " + dir + "/no-such-run");
  EXPECT_EQ(missing.exit_code, kExitConfigError) << missing.output;
  EXPECT_NE(missing.output.find("rlfusion: error:"), std::string::npos) << missing.output;
  EXPECT_NE(missing.output.find(dir + "/no-such-run"), std::string::npos) << missing.output;

  const Result no_trace = run_rlfusion("report " + dir);
  EXPECT_EQ(no_trace.exit_code, kExitConfigError) << no_trace.output;
  EXPECT_NE(no_trace.output.find(dir + "/trace.h5"), std::string::npos) << no_trace.output;

  std::ofstream(dir + "/trace.h5") << "half a trace";
  const Result corrupt = run_rlfusion("report " + dir);
  EXPECT_EQ(corrupt.exit_code, kExitConfigError) << corrupt.output;
  EXPECT_NE(corrupt.output.find(dir + "/trace.h5"), std::string::npos) << corrupt.output;

  EXPECT_EQ(run_rlfusion("report").exit_code, kExitConfigError);
  EXPECT_EQ(run_rlfusion("report " + dir + " --json --csv").exit_code, kExitConfigError);
}

}  // namespace
}  // namespace rlf
