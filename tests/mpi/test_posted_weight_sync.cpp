// PostedWeightSync (StaleSync's weight sync for pipelines deeper than one step): learner 0 posts
// versions and overwrites its parameters at once, as training does; every actor receives each
// version, in order, exactly as it was when posted (what one rank holding every version would
// see), whenever it asks for it. Learner 0's links count one copy per actor and version. Ranks
// that are neither learner 0 nor actors take no part.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace rlf
