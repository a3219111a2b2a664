// StaleSync's weight sync for a disaggregated pipeline deeper than one step: learner 0 posts a
// version to the actors and trains on without waiting for them (a snapshot of its parameters,
// sent to every actor by nonblocking sends, counted per link class), and each actor receives that
// version when its schedule needs it. Posts and receives match in order, one version at a time,
// on a communicator of their own. Unlike WeightSync's hierarchical broadcast the sends are flat
// (learner 0 sends every actor its copy): a tree would need actors to forward a version as soon
// as it arrives, while they take it only when they need it.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "mpi_comm/links.h"
#include "src/runtime/weight_sync.h"

namespace rlf {

class PostedWeightSync {
 public:
  // Completes every request of the list; a rank that hosts queue shards serves them meanwhile.
  using Wait = std::function<void(std::vector<MPI_Request>&)>;

  // Collective over the members of `members` (learner 0 and the actors); others hold nothing.
  PostedWeightSync(const WeightSync& members, Links& links);
  // The last post must have been completed by finish().
  ~PostedWeightSync();
  PostedWeightSync(const PostedWeightSync&) = delete;
  PostedWeightSync& operator=(const PostedWeightSync&) = delete;

  bool member() const { return comm_ != MPI_COMM_NULL; }
  bool root() const;
  // Root: completes the previous post (`wait`), copies params[count] into the snapshot and posts
  // it to every actor; returns at once. Returns the bytes posted (0 off the group).
  uint64_t post(const float* params, int64_t count, const Wait& wait);
  // Root, with the actors in TP groups of T = slices.size() consecutive actors: like post, but
  // the actor of index a (among the actors, in world-rank order) gets only slices[a % T] (its TP
  // rank's slice of the model). Returns the bytes posted.
  uint64_t post_slices(const std::vector<std::vector<float>>& slices, const Wait& wait);
  // Actors: the next posted version into params[count], complete when it returns (the link
  // emulation's delay paid here). Returns the bytes received (0 off the group).
  uint64_t receive(float* params, int64_t count, const Wait& wait);
  // Root: completes the last post (call before the actors stop taking part in MPI).
  void finish(const Wait& wait);

 private:
  // `transfer` (MPI_Isend or MPI_Irecv's shape) once per run of at most INT_MAX floats of
  // data[count], with `peer`; appends the requests.
  template <typename Transfer>
  void in_buckets(float* data, int64_t count, int peer, Transfer transfer,
                  std::vector<MPI_Request>& requests) const;

  Links& links_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::vector<float> snapshot_;
  std::vector<MPI_Request> pending_;  // the root's last post
};

}  // namespace rlf
