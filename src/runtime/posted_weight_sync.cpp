#include "src/runtime/posted_weight_sync.h"

#include <algorithm>
#include <climits>
#include <stdexcept>

namespace rlf {

PostedWeightSync::PostedWeightSync(const WeightSync& members) {
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

std::vector<MPI_Request> PostedWeightSync::broadcast(float* data, int64_t count) {
  std::vector<MPI_Request> requests;
  for (int64_t first = 0; first < count; first += INT_MAX) {
    const int n = int(std::min<int64_t>(count - first, INT_MAX));
    requests.emplace_back();
    MPI_Ibcast(data + first, n, MPI_FLOAT, /*root=*/0, comm_, &requests.back());
  }
  return requests;
}

uint64_t PostedWeightSync::post(const float* params, int64_t count, const Wait& wait) {
  if (!member()) return 0;
  if (!root()) throw std::logic_error("PostedWeightSync::post on an actor");
  // The snapshot may still be in flight: the previous version is complete before it is reused.
  finish(wait);
  snapshot_.assign(params, params + count);
  pending_ = broadcast(snapshot_.data(), count);
  return uint64_t(count) * sizeof(float);
}

uint64_t PostedWeightSync::receive(float* params, int64_t count, const Wait& wait) {
  if (!member()) return 0;
  if (root()) throw std::logic_error("PostedWeightSync::receive on learner 0");
  std::vector<MPI_Request> requests = broadcast(params, count);
  wait(requests);
  return uint64_t(count) * sizeof(float);
}

void PostedWeightSync::finish(const Wait& wait) {
  if (pending_.empty()) return;
  wait(pending_);
  pending_.clear();
}

}  // namespace rlf
