// StaleSync's weight sync for a disaggregated pipeline deeper than one step: learner 0 posts a
// version to the actors and trains on without waiting for them (a snapshot of its parameters,
// sent by nonblocking broadcasts), and each actor receives that version when its schedule needs
// it. Posts and receives match in order, one version at a time, on a communicator of their own.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "src/runtime/weight_sync.h"

namespace rlf {

class PostedWeightSync {
 public:
  // Completes every request of the list; a rank that hosts queue shards serves them meanwhile.
  using Wait = std::function<void(std::vector<MPI_Request>&)>;

  // Collective over the members of `members` (learner 0 and the actors); others hold nothing.
  explicit PostedWeightSync(const WeightSync& members);
  // The last post must have been completed by finish().
  ~PostedWeightSync();
  PostedWeightSync(const PostedWeightSync&) = delete;
  PostedWeightSync& operator=(const PostedWeightSync&) = delete;

  bool member() const { return comm_ != MPI_COMM_NULL; }
  bool root() const;
  // Root: completes the previous post (`wait`), copies params[count] into the snapshot and posts
  // it; returns at once. Returns the bytes posted (0 off the group).
  uint64_t post(const float* params, int64_t count, const Wait& wait);
  // Actors: the next posted version into params[count], complete when it returns. Returns the
  // bytes received (0 off the group).
  uint64_t receive(float* params, int64_t count, const Wait& wait);
  // Root: completes the last post (call before the actors stop taking part in MPI).
  void finish(const Wait& wait);

 private:
  // One nonblocking broadcast per run of at most INT_MAX floats of data[count].
  std::vector<MPI_Request> broadcast(float* data, int64_t count);

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::vector<float> snapshot_;
  std::vector<MPI_Request> pending_;  // the root's last post
};

}  // namespace rlf
