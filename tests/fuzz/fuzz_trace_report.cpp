// libFuzzer target: the trace validation layer and the report's arithmetic. Each input becomes a
// trace (up to 4 ranks of events, trained samples, link rows, router loads and expert migrations
// with arbitrary values, phases and link classes out of range included). trace_value_error must
// either reject it or every figure the report computes must be defined: each rank's time
// categories sum to the wall time, steps have non-negative walls, the per-layer expert
// imbalance is finite and >= 1, and the Chrome timeline is balanced JSON. A violation aborts.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "src/io/chrome_trace.h"
#include "src/io/router_summary.h"
#include "src/io/trace_reader.h"
#include "src/io/trace_summary.h"

namespace {

// Reads little fields off the input; zeros once it is used up.
class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return at_ >= size_; }
  template <typename T>
  T take() {
    T value{};
    const size_t n = std::min(sizeof(T), size_ - std::min(at_, size_));
    std::memcpy(&value, data_ + at_, n);
    at_ += sizeof(T);
    return value;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

#define require(condition) \
  ((condition) ? (void)0 : (std::fprintf(stderr, "violated: %s\n", #condition), std::abort()))

size_t count_of(const std::string& text, char c) {
  size_t count = 0;
  for (const char x : text) count += x == c;
  return count;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Bytes in(data, size);
  rlf::TraceData trace;
  trace.world_size = 1 + in.take<uint8_t>() % 4;
  trace.ranks.resize(size_t(trace.world_size));
  trace.samples.resize(size_t(trace.world_size));
  trace.links.resize(size_t(trace.world_size));
  trace.router_loads.resize(size_t(trace.world_size));
  trace.migrations.resize(size_t(trace.world_size));
  // Times on a 1/64 s grid (exact in binary, so sums are exact) or, when the flag byte says so,
  // raw doubles (NaN, infinities, huge values).
  while (!in.empty()) {
    const uint8_t kind = in.take<uint8_t>();
    const size_t rank = in.take<uint8_t>() % size_t(trace.world_size);
    if (kind % 16 < 11) {
      rlf::TraceEvent e;
      e.phase = rlf::Phase(int32_t(in.take<int8_t>()));
      if (kind & 0x80) {
        e.begin = in.take<double>();
        e.end = in.take<double>();
      } else {
        e.begin = in.take<int16_t>() / 64.0;
        e.end = e.begin + in.take<int16_t>() / 64.0;
      }
      e.tokens = in.take<int16_t>();
      e.bytes = in.take<int16_t>();
      e.version = in.take<int8_t>();
      e.memory_bytes = int64_t(in.take<int16_t>()) << 10;
      trace.ranks[rank].push_back(e);
    } else if (kind % 16 == 11) {
      rlf::TrainedSample s;
      s.sample_id = in.take<int16_t>();
      s.version_min = in.take<int8_t>();
      s.version_max = in.take<int8_t>();
      s.trained_version = in.take<int8_t>();
      trace.samples[rank].push_back(s);
    } else if (kind % 16 == 12) {
      trace.router_loads[rank].push_back(
          {in.take<int8_t>(), in.take<int8_t>(), in.take<int8_t>(), int64_t(in.take<int16_t>())});
    } else if (kind % 16 == 13) {
      rlf::ExpertMigration m;
      m.step = in.take<int8_t>();
      m.experts_moved = in.take<int8_t>();
      m.bytes = in.take<int16_t>();
      m.predicted_gain_seconds = in.take<double>();
      m.cost_seconds = in.take<double>();
      m.max_mean_before = in.take<double>();
      m.max_mean_after = in.take<double>();
      trace.migrations[rank].push_back(m);
    } else {
      trace.links[rank].push_back(
          {in.take<int8_t>(), int64_t(in.take<int32_t>()), int64_t(in.take<int16_t>())});
    }
  }
  if (!rlf::trace_value_error(trace).empty()) return 0;  // rejected: read_trace would refuse it

  const rlf::TraceSummary s = rlf::summarize(trace);
  require(std::isfinite(s.begin) && std::isfinite(s.end) && s.wall() >= 0);
  for (const rlf::RankBreakdown& r : s.ranks) {
    double sum = 0;
    for (const double seconds : r.seconds) {
      require(std::isfinite(seconds) && seconds >= -1e-9);
      sum += seconds;
    }
    require(std::fabs(sum - s.wall()) <= 1e-9 * std::max(1.0, s.wall()));
    require(r.link_bytes[0] >= 0 && r.link_bytes[1] >= 0);
  }
  for (const rlf::StepThroughput& step : s.steps) {
    require(step.wall() >= 0 && step.tokens >= 0 && std::isfinite(step.tokens_per_second()));
  }
  for (const rlf::LayerImbalance& l : rlf::layer_imbalance(trace)) {
    require(l.steps == 0 ||
            (std::isfinite(l.mean_max_over_mean) && l.mean_max_over_mean >= 1 - 1e-9 &&
             l.worst_max_over_mean >= l.mean_max_over_mean - 1e-9));
    require(l.hottest_share >= 0 && l.hottest_share <= 1 + 1e-9);
  }
  for (const rlf::ExpertMigration& m : rlf::migrations_of(trace)) require(m.bytes >= 0);
  const std::string json = rlf::chrome_trace_json(trace);
  require(count_of(json, '{') == count_of(json, '}'));
  require(count_of(json, '[') == count_of(json, ']'));
  require(json.find("nan") == std::string::npos && json.find("inf") == std::string::npos);
  return 0;
}
