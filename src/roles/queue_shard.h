// One DistQueue shard's storage: a bounded FIFO of samples. Bounded so that fast actors cannot
// outrun learners without limit (a full shard refuses a batch and the producer retries later:
// back-pressure); nothing is ever dropped. Plain C++, no MPI: the server loop in dist_queue.cpp
// owns one of these per shard it hosts.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <vector>

#include "src/roles/queue_sample.h"

namespace rlf {

class QueueShard {
 public:
  // Any version: the v_min that admits every sample.
  static constexpr int32_t kAnyVersion = std::numeric_limits<int32_t>::min();

  // capacity: the most samples stored at once (>= 1, else ConfigError).
  explicit QueueShard(int64_t capacity);

  int64_t capacity() const { return capacity_; }
  int64_t stored() const { return int64_t(samples_.size()); }
  int64_t free_slots() const { return capacity_ - stored(); }

  // All or nothing: stores every sample of `batch` (in order) when they all fit and returns true;
  // otherwise stores none, leaves `batch` untouched and returns false (the caller retries). A
  // batch larger than the capacity could never fit: std::invalid_argument (callers split).
  bool put(std::vector<QueueSample>& batch);

  // Removes and returns up to `count` samples with version_min >= v_min, oldest first; samples
  // that are too old stay, in their order, for a consumer with a looser policy.
  std::vector<QueueSample> take(int64_t count, int32_t v_min = kAnyVersion);
  // Removes and returns every stored sample with first_id <= sample_id < first_id + count,
  // oldest first; the others stay in order. StaleSync's bound: a sample of the range older than
  // v_min (version_min < v_min) is never handed out; it is discarded and counted in *stale
  // (when given) and in discarded_stale(), so the consumer stops waiting for its id.
  std::vector<QueueSample> take_range(int64_t first_id, int64_t count, int32_t v_min = kAnyVersion,
                                      int64_t* stale = nullptr);
  // How many samples take(·, v_min) could return now.
  int64_t available(int32_t v_min = kAnyVersion) const;

  // Totals since construction.
  int64_t total_stored() const { return total_stored_; }
  int64_t total_served() const { return total_served_; }
  int64_t rejected_puts() const { return rejected_puts_; }
  int64_t discarded_stale() const { return discarded_stale_; }

 private:
  // Removes and returns up to `count` samples for which `wanted` holds, oldest first.
  std::vector<QueueSample> take_if(int64_t count,
                                   const std::function<bool(const QueueSample&)>& wanted);

  int64_t capacity_;
  std::deque<QueueSample> samples_;  // arrival order
  int64_t total_stored_ = 0, total_served_ = 0, rejected_puts_ = 0, discarded_stale_ = 0;
};

}  // namespace rlf
