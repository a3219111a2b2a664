#include "src/roles/queue_shard.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/error.h"

namespace rlf {

QueueShard::QueueShard(int64_t capacity) : capacity_(capacity) {
  if (capacity < 1)
    throw ConfigError("queue shard capacity must be at least 1 sample, got " +
                      std::to_string(capacity));
}

bool QueueShard::put(std::vector<QueueSample>& batch) {
  const int64_t n = int64_t(batch.size());
  if (n > capacity_)
    throw std::invalid_argument("QueueShard::put: a batch of " + std::to_string(n) +
                                " samples can never fit a shard of capacity " +
                                std::to_string(capacity_));
  if (n > free_slots()) {
    ++rejected_puts_;
    return false;
  }
  for (auto& s : batch) samples_.push_back(std::move(s));
  batch.clear();
  total_stored_ += n;
  return true;
}

std::vector<QueueSample> QueueShard::take(int64_t count, int32_t v_min) {
  return take_if(count, [v_min](const QueueSample& s) { return s.version_min >= v_min; });
}

std::vector<QueueSample> QueueShard::take_range(int64_t first_id, int64_t count, int32_t v_min,
                                                int64_t* stale) {
  std::vector<QueueSample> taken = take_if(count, [first_id, count](const QueueSample& s) {
    return s.sample_id >= first_id && s.sample_id - first_id < count;
  });
  const auto too_old = [v_min](const QueueSample& s) { return s.version_min < v_min; };
  const int64_t old = std::count_if(taken.begin(), taken.end(), too_old);
  if (old > 0) {
    taken.erase(std::remove_if(taken.begin(), taken.end(), too_old), taken.end());
    total_served_ -= old;
    discarded_stale_ += old;
  }
  if (stale) *stale = old;
  return taken;
}

std::vector<QueueSample> QueueShard::take_if(
    int64_t count, const std::function<bool(const QueueSample&)>& wanted) {
  std::vector<QueueSample> out;
  if (count <= 0) return out;
  // One pass that stops at the count: wanted samples leave, skipped ones are compacted towards
  // the front keeping their order, and the untouched tail moves down behind them.
  auto keep = samples_.begin();
  auto it = samples_.begin();
  for (; it != samples_.end() && int64_t(out.size()) < count; ++it) {
    if (wanted(*it)) {
      out.push_back(std::move(*it));
    } else {
      if (keep != it) *keep = std::move(*it);
      ++keep;
    }
  }
  if (keep != it) samples_.erase(std::move(it, samples_.end(), keep), samples_.end());
  total_served_ += int64_t(out.size());
  return out;
}

int64_t QueueShard::available(int32_t v_min) const {
  int64_t n = 0;
  for (const auto& s : samples_) n += s.version_min >= v_min;
  return n;
}

}  // namespace rlf
