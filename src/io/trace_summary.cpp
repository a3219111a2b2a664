#include "src/io/trace_summary.h"

#include <algorithm>
#include <limits>
#include <map>
#include <queue>

namespace rlf {

const char* time_category_name(TimeCategory category) {
  switch (category) {
    case TimeCategory::Generate:
      return "generate";
    case TimeCategory::Train:
      return "train";
    case TimeCategory::Queue:
      return "queue";
    case TimeCategory::Communication:
      return "communication";
    case TimeCategory::Other:
      return "other";
    case TimeCategory::Idle:
      return "idle";
  }
  return "unknown";
}

TimeCategory time_category(Phase phase) {
  switch (phase) {
    case Phase::Generate:
      return TimeCategory::Generate;
    case Phase::Train:
    case Phase::Proximal:
    case Phase::Optimizer:
    case Phase::GradientReduce:
      return TimeCategory::Train;
    case Phase::QueuePut:
    case Phase::QueueGet:
      return TimeCategory::Queue;
    case Phase::WeightSync:
    case Phase::Offload:
    case Phase::Onload:
    case Phase::Reshard:
    case Phase::Migrate:
    case Phase::Reorder:
      return TimeCategory::Communication;
    case Phase::Idle:
      return TimeCategory::Idle;
    case Phase::Score:
    case Phase::Reference:
    case Phase::Evaluate:
    case Phase::Other:
      return TimeCategory::Other;
  }
  return TimeCategory::Other;
}

std::array<double, kTimeCategoryCount> time_breakdown(const std::vector<TraceEvent>& events,
                                                      double begin, double end) {
  std::array<double, kTimeCategoryCount> seconds{};
  if (!(end > begin)) return seconds;
  std::vector<const TraceEvent*> by_begin;
  std::vector<double> points = {begin, end};
  for (const TraceEvent& e : events) {
    if (e.end > e.begin && e.end > begin && e.begin < end) {
      by_begin.push_back(&e);
      points.push_back(std::clamp(e.begin, begin, end));
      points.push_back(std::clamp(e.end, begin, end));
    }
  }
  std::sort(by_begin.begin(), by_begin.end(),
            [](const TraceEvent* a, const TraceEvent* b) { return a->begin < b->begin; });
  std::sort(points.begin(), points.end());
  points.erase(std::unique(points.begin(), points.end()), points.end());

  // Sweep the elementary intervals between consecutive points. The heap's top is the innermost
  // event begun so far: latest begin, and of equal begins the one ending first. Events that have
  // ended are dropped lazily when they reach the top.
  auto outer = [](const TraceEvent* a, const TraceEvent* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end > b->end;
  };
  std::priority_queue<const TraceEvent*, std::vector<const TraceEvent*>, decltype(outer)> active(
      outer);
  size_t next = 0;
  for (size_t i = 0; i + 1 < points.size(); ++i) {
    const double a = points[i], b = points[i + 1];
    while (next < by_begin.size() && by_begin[next]->begin <= a) active.push(by_begin[next++]);
    while (!active.empty() && active.top()->end <= a) active.pop();
    // Every event still active began at or before a and ends at a point after a, so at or after
    // b: it covers the whole interval.
    const TimeCategory category =
        active.empty() ? TimeCategory::Idle : time_category(active.top()->phase);
    seconds[size_t(category)] += b - a;
  }
  return seconds;
}

namespace {

// The time inside [begin, end) that `phase`'s events cover (their union, whatever is nested in
// them included).
double phase_cover_seconds(const std::vector<TraceEvent>& events, Phase phase, double begin,
                           double end) {
  std::vector<std::pair<double, double>> spans;
  for (const TraceEvent& e : events) {
    const double from = std::max(e.begin, begin), to = std::min(e.end, end);
    if (e.phase == phase && to > from) spans.emplace_back(from, to);
  }
  std::sort(spans.begin(), spans.end());
  double covered = 0, reached = begin;
  for (const auto& [from, to] : spans) {
    if (to > reached) covered += to - std::max(from, reached);
    reached = std::max(reached, to);
  }
  return covered;
}

bool is_training(Phase phase) {
  return time_category(phase) == TimeCategory::Train;
}

std::vector<StepThroughput> steps_of(const TraceData& trace) {
  struct Extent {
    double first_begin = std::numeric_limits<double>::infinity();
    double last_training_end = -std::numeric_limits<double>::infinity();
    bool trained = false;
    int64_t tokens = 0;
  };
  std::map<int32_t, Extent> versions;
  for (const auto& events : trace.ranks) {
    for (const TraceEvent& e : events) {
      if (e.version == kNoVersion) continue;
      Extent& x = versions[e.version];
      x.first_begin = std::min(x.first_begin, e.begin);
      if (is_training(e.phase)) {
        x.trained = true;
        x.last_training_end = std::max(x.last_training_end, e.end);
      }
      if (e.phase == Phase::Train) x.tokens += e.tokens;
    }
  }
  std::vector<StepThroughput> steps;
  for (const auto& [version, x] : versions) {
    if (!x.trained) continue;
    StepThroughput step;
    step.version = version;
    // Steps may overlap (actors generate v+1 while learners train v), so a step's wall time is
    // the time between consecutive step ends: the walls add up to the whole training time.
    step.begin = steps.empty() ? x.first_begin : steps.back().end;
    step.end = x.last_training_end;
    step.tokens = x.tokens;
    steps.push_back(step);
  }
  return steps;
}

}  // namespace

TraceSummary summarize(const TraceData& trace) {
  TraceSummary summary;
  bool any = false;
  for (const auto& events : trace.ranks) {
    for (const TraceEvent& e : events) {
      summary.begin = any ? std::min(summary.begin, e.begin) : e.begin;
      summary.end = any ? std::max(summary.end, e.end) : e.end;
      any = true;
    }
  }
  summary.steps = steps_of(trace);
  for (StepThroughput& step : summary.steps) {
    for (const auto& events : trace.ranks) {
      const auto seconds = time_breakdown(events, step.begin, step.end);
      step.generate_seconds =
          std::max(step.generate_seconds, seconds[size_t(TimeCategory::Generate)]);
      step.train_seconds = std::max(step.train_seconds, seconds[size_t(TimeCategory::Train)]);
      step.generate_phase_seconds =
          std::max(step.generate_phase_seconds,
                   phase_cover_seconds(events, Phase::Generate, step.begin, step.end));
    }
  }
  if (!summary.steps.empty()) {
    summary.total.begin = summary.steps.front().begin;
    summary.total.end = summary.steps.back().end;
    for (const StepThroughput& s : summary.steps) summary.total.tokens += s.tokens;
  }
  std::array<PhaseTotal, kPhaseCount> phases{};
  for (int r = 0; r < int(trace.ranks.size()); ++r) {
    const auto& events = trace.ranks[size_t(r)];
    RankBreakdown rank;
    rank.rank = r;
    rank.seconds = time_breakdown(events, summary.begin, summary.end);
    for (const TraceEvent& e : events) {
      rank.memory_peak_bytes = std::max(rank.memory_peak_bytes, e.memory_bytes);
      PhaseTotal& p = phases[size_t(e.phase)];
      p.events += 1;
      p.seconds += e.end - e.begin;
      p.tokens += e.tokens;
      p.bytes += e.bytes;
    }
    if (size_t(r) < trace.links.size()) {
      for (const LinkTraffic& l : trace.links[size_t(r)]) {
        rank.link_bytes[size_t(l.link_class)] += l.bytes;
        rank.link_messages[size_t(l.link_class)] += l.messages;
        summary.has_link_traffic = true;
      }
    }
    summary.ranks.push_back(rank);
  }
  for (const auto& samples : trace.samples) {
    for (const TrainedSample& s : samples) summary.staleness[s.staleness()] += 1;
  }
  for (int p = 0; p < kPhaseCount; ++p) {
    if (phases[size_t(p)].events == 0) continue;
    phases[size_t(p)].phase = Phase(p);
    summary.phases.push_back(phases[size_t(p)]);
  }
  return summary;
}

}  // namespace rlf
