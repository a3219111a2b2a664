// What `rlfusion report` computes from a trace (definitions: docs/METRICS.md, `rlfusion report`):
// throughput per policy version, each rank's time split into categories, and totals per phase.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <vector>

#include "src/io/trace.h"
#include "src/io/trace_reader.h"

namespace rlf {

// The report's time categories. Each phase belongs to one; Phase::Idle (explicit waiting) and
// time no event covers are both idle.
enum class TimeCategory { Generate, Train, Queue, Communication, Other, Idle };
inline constexpr int kTimeCategoryCount = int(TimeCategory::Idle) + 1;
const char* time_category_name(TimeCategory category);  // "generate", ..., "idle"
TimeCategory time_category(Phase phase);

// Seconds of [begin, end) in each category for one rank. Each instant goes to the innermost event
// covering it (the latest begun; scopes nest), so nested phases are not counted twice and the
// categories sum to end - begin; instants no event covers are idle.
std::array<double, kTimeCategoryCount> time_breakdown(const std::vector<TraceEvent>& events,
                                                      double begin, double end);

// One training step: the events of one policy version.
struct StepThroughput {
  int32_t version = kNoVersion;
  double begin = 0;    // end of the previous step; the first step: its version's first event
  double end = 0;      // last end of a Train, Optimizer or GradientReduce event of the version
  int64_t tokens = 0;  // tokens of its Train events, all ranks
  // Inside [begin, end), the busiest rank's seconds in the generate and the train category
  // (time_breakdown): what one step spends generating and training, the first step's one-off
  // costs (first touches of every buffer) apart from the later ones'.
  double generate_seconds = 0, train_seconds = 0;
  // The busiest rank's generation phases' wall time inside [begin, end), the events nested in
  // them included: the long-tail bubble (the Idle event at a phase's end, the decode steps'
  // unused share) is generation's own time here, as the planner's generation part counts it.
  double generate_phase_seconds = 0;

  double wall() const { return end > begin ? end - begin : 0.0; }
  // 0 for a step shorter than the clock can time (MPI_Wtime's resolution is far coarser than a
  // nanosecond), so a damaged trace's denormal step never divides to infinity.
  double tokens_per_second() const { return wall() > 1e-9 ? double(tokens) / wall() : 0.0; }
};

struct RankBreakdown {
  int rank = 0;
  std::array<double, kTimeCategoryCount> seconds{};
  int64_t memory_peak_bytes = 0;  // largest memory_bytes of the rank's events
  // Bytes and messages the rank sent per link class (index: 0 intra-node, 1 inter-node).
  std::array<int64_t, 2> link_bytes{};
  std::array<int64_t, 2> link_messages{};
};

struct PhaseTotal {
  Phase phase = Phase::Other;
  int64_t events = 0;
  double seconds = 0;  // sum of event durations (nested events count in each phase)
  int64_t tokens = 0;
  int64_t bytes = 0;
};

struct TraceSummary {
  double begin = 0;                   // first begin of any event on any rank
  double end = 0;                     // last end of any event on any rank
  std::vector<StepThroughput> steps;  // by version, ascending
  StepThroughput total;               // all steps: first step's begin to last step's end
  std::vector<RankBreakdown> ranks;   // every rank, each over [begin, end)
  std::vector<PhaseTotal> phases;     // phases with at least one event, in Phase order
  // Trained samples by staleness (trained version - oldest token version), all ranks; empty
  // when the trace has no trained-sample records.
  std::map<int32_t, int64_t> staleness;
  bool has_link_traffic = false;  // some rank recorded link traffic (multi-rank `train`)

  double wall() const { return end > begin ? end - begin : 0.0; }
};

TraceSummary summarize(const TraceData& trace);

}  // namespace rlf
