#include "src/runtime/posted_weight_sync.h"

#include <algorithm>
#include <climits>
#include <stdexcept>

namespace rlf {

PostedWeightSync::PostedWeightSync(const WeightSync& members, Links& links) : links_(links) {
  if (members.member()) MPI_Comm_dup(members.comm(), &comm_);
}

PostedWeightSync::~PostedWeightSync() {
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

bool PostedWeightSync::root() const {
  if (!member()) return false;
  int rank = 0;
  MPI_Comm_rank(comm_, &rank);
  return rank == 0;
}

template <typename Transfer>
void PostedWeightSync::in_buckets(float* data, int64_t count, int peer, Transfer transfer,
                                  std::vector<MPI_Request>& requests) const {
  for (int64_t first = 0; first < count; first += INT_MAX) {
    const int n = int(std::min<int64_t>(count - first, INT_MAX));
    requests.emplace_back();
    transfer(data + first, n, MPI_FLOAT, peer, /*tag=*/0, comm_, &requests.back());
  }
}

uint64_t PostedWeightSync::post(const float* params, int64_t count, const Wait& wait) {
  if (!member()) return 0;
  if (!root()) throw std::logic_error("PostedWeightSync::post on an actor");
  // The snapshot may still be in flight: the previous version is complete before it is reused.
  finish(wait);
  snapshot_.assign(params, params + count);
  int size = 0;
  MPI_Comm_size(comm_, &size);
  const uint64_t bytes = uint64_t(count) * sizeof(float);
  for (int actor = 1; actor < size; ++actor) {
    const TrafficScope traffic(links_, TrafficKind::WeightSync);
    links_.count_send(links_.world_rank_of(actor, comm_), bytes);
    in_buckets(snapshot_.data(), count, actor, MPI_Isend, pending_);
  }
  return bytes * uint64_t(size - 1);
}

uint64_t PostedWeightSync::post_slices(const std::vector<std::vector<float>>& slices,
                                       const Wait& wait) {
  if (!member()) return 0;
  if (!root()) throw std::logic_error("PostedWeightSync::post_slices on an actor");
  if (slices.empty()) throw std::invalid_argument("PostedWeightSync::post_slices: no slice");
  finish(wait);
  // The slices side by side in the snapshot.
  std::vector<int64_t> offsets, counts;
  snapshot_.clear();
  for (const std::vector<float>& slice : slices) {
    offsets.push_back(int64_t(snapshot_.size()));
    counts.push_back(int64_t(slice.size()));
    snapshot_.insert(snapshot_.end(), slice.begin(), slice.end());
  }
  int size = 0;
  MPI_Comm_size(comm_, &size);
  uint64_t posted = 0;
  for (int actor = 1; actor < size; ++actor) {
    const size_t slice = size_t(actor - 1) % slices.size();
    const uint64_t bytes = uint64_t(counts[slice]) * sizeof(float);
    const TrafficScope traffic(links_, TrafficKind::WeightSync);
    links_.count_send(links_.world_rank_of(actor, comm_), bytes);
    in_buckets(snapshot_.data() + offsets[slice], counts[slice], actor, MPI_Isend, pending_);
    posted += bytes;
  }
  return posted;
}

uint64_t PostedWeightSync::receive(float* params, int64_t count, const Wait& wait) {
  if (!member()) return 0;
  if (root()) throw std::logic_error("PostedWeightSync::receive on learner 0");
  std::vector<MPI_Request> requests;
  in_buckets(params, count, /*peer=*/0, MPI_Irecv, requests);
  wait(requests);
  const uint64_t bytes = uint64_t(count) * sizeof(float);
  links_.emulate(links_.world_rank_of(0, comm_), bytes);
  return bytes;
}

void PostedWeightSync::finish(const Wait& wait) {
  if (pending_.empty()) return;
  wait(pending_);
  pending_.clear();
}

}  // namespace rlf
