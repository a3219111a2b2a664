// PostedWeightSync (StaleSync's weight sync for pipelines deeper than one step): learner 0 posts
// versions and overwrites its parameters at once, as training does; every actor receives each
// version, in order, exactly as it was when posted (what one rank holding every version would
// see), whenever it asks for it. Learner 0's links count one copy per actor and version. Ranks
// that are neither learner 0 nor actors take no part. With actors in TP groups, each actor TP rank
// gets only its own slice, by WeightSync::send_slices / broadcast_slice and
// PostedWeightSync::post_slices.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "mpi_comm/topology.h"
#include "src/runtime/posted_weight_sync.h"
#include "tests/mpi/mpi_test_util.h"

namespace rlf {
namespace {

constexpr int64_t kCount = 5003;
constexpr int kVersions = 4;

float value(int version, int64_t i) {
  return float(test::hash(uint64_t(version), uint64_t(i), 7) % 100000) * 1e-3f;
}

void wait_all(std::vector<MPI_Request>& requests) {
  MPI_Waitall(int(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
}

TEST(PostedWeightSync, ActorsReceiveEachVersionAsPostedWhileTheLearnerMovesOn) {
  // Half learners, half actors (one rank: a learner alone); the last rank a queue rank from 3 on.
  LayoutConfig layout;
  if (test::world_size() >= 3) layout.queue_ranks = 1;
  Topology topology(MPI_COMM_WORLD, layout);
  WeightSync members(MPI_COMM_WORLD, topology);
  PostedWeightSync posted(members, topology.links());
  const bool learner0 = topology.world_rank() == topology.ranks_of(Role::Learner).front();
  EXPECT_EQ(posted.member(), learner0 || topology.role() == Role::Actor);
  EXPECT_EQ(posted.root(), learner0);

  const uint64_t counted_before = test::link_bytes(topology.links());
  const uint64_t actors = topology.ranks_of(Role::Actor).size();
  const uint64_t version_bytes = uint64_t(kCount) * sizeof(float);
  std::vector<float> params(size_t(kCount), -1.0f);
  int wrong = 0;
  for (int version = 1; version <= kVersions; ++version) {
    if (learner0) {
      for (int64_t i = 0; i < kCount; ++i) params[size_t(i)] = value(version, i);
      EXPECT_EQ(posted.post(params.data(), kCount, wait_all), version_bytes * actors);
      // Training changes the parameters while the actors may not have received them yet.
      std::fill(params.begin(), params.end(), -2.0f);
    } else if (posted.member()) {
      // Actors ask late (after the learner has moved on), each at its own time.
      std::this_thread::sleep_for(std::chrono::milliseconds(topology.world_rank() % 3));
      EXPECT_EQ(posted.receive(params.data(), kCount, wait_all), version_bytes);
      for (int64_t i = 0; i < kCount; ++i) wrong += params[size_t(i)] != value(version, i);
    } else {
      EXPECT_EQ(posted.post(params.data(), kCount, wait_all), 0u);
      EXPECT_EQ(posted.receive(params.data(), kCount, wait_all), 0u);
    }
  }
  posted.finish(wait_all);
  EXPECT_EQ(test::link_bytes(topology.links()) - counted_before,
            learner0 ? version_bytes * actors * kVersions : 0u);
  EXPECT_EQ(wrong, 0);
  EXPECT_TRUE(test::on_every_rank(wrong == 0));
}

// Actors in TP groups of 2 (consecutive actors): actor a is TP rank a % 2 and gets slice a % 2 of
// every version, blocking (send_slices) and posted (post_slices), never the other slice; the
// bytes are the slice's, counted once per actor.
TEST(PostedWeightSync, ActorTensorParallelRanksReceiveOnlyTheirSlices) {
  LayoutConfig layout;
  if (test::world_size() >= 3) layout.queue_ranks = 1;
  Topology topology(MPI_COMM_WORLD, layout);
  constexpr int kSlices = 2;
  WeightSync members(MPI_COMM_WORLD, topology, kSlices);
  PostedWeightSync posted(members, topology.links());
  EXPECT_EQ(members.actor_slices(), kSlices);
  const bool learner0 = topology.world_rank() == topology.ranks_of(Role::Learner).front();
  const std::vector<int>& actors = topology.ranks_of(Role::Actor);
  const auto at = std::find(actors.begin(), actors.end(), topology.world_rank());
  const int slice = at == actors.end() ? -1 : int(at - actors.begin()) % kSlices;
  // Slices of unequal sizes, filled with values naming version and slice.
  const std::vector<int64_t> counts = {kCount, kCount / 3};
  auto slice_value = [](int version, int r, int64_t i) { return value(version * 10 + r, i); };
  int wrong = 0;
  for (int version = 1; version <= kVersions; ++version) {
    const bool posting = version % 2 == 0;  // blocking and posted versions alternate
    if (learner0) {
      std::vector<std::vector<float>> slices(kSlices);
      uint64_t sent = 0;
      for (int r = 0; r < kSlices; ++r) {
        for (int64_t i = 0; i < counts[size_t(r)]; ++i)
          slices[size_t(r)].push_back(slice_value(version, r, i));
      }
      for (size_t a = 0; a < actors.size(); ++a)
        sent += uint64_t(counts[a % kSlices]) * sizeof(float);
      if (posting) {
        EXPECT_EQ(posted.post_slices(slices, wait_all), sent);
      } else {
        // (A hierarchical broadcast's bytes are the payload once per call.)
        EXPECT_EQ(members.send_slices(slices), uint64_t(counts[0] + counts[1]) * sizeof(float));
      }
    } else if (slice >= 0) {
      const int64_t count = counts[size_t(slice)];
      std::vector<float> params(size_t(count), -1.0f);
      const uint64_t received = posting ? posted.receive(params.data(), count, wait_all)
                                        : members.broadcast_slice(slice, params.data(), count);
      EXPECT_EQ(received, uint64_t(count) * sizeof(float));
      for (int64_t i = 0; i < count; ++i)
        wrong += params[size_t(i)] != slice_value(version, slice, i);
    } else {
      float nothing = 0;
      EXPECT_EQ(members.broadcast_slice(0, &nothing, 1), 0u);
      EXPECT_EQ(members.broadcast_slice(1, &nothing, 1), 0u);
    }
  }
  posted.finish(wait_all);
  EXPECT_EQ(wrong, 0);
  EXPECT_TRUE(test::on_every_rank(wrong == 0));
}

}  // namespace
}  // namespace rlf
