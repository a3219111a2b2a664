// The bytes derived from the routing logs (src/sim/dispatch_replay.h) against the Links counters
// of what moved them, on fresh random inputs every run (the seed printed on failure): the
// dispatchers' (every mode, one and two ranks per virtual node, spare slots, a slot table changed
// between dispatches, a rank without tokens, two dispatchers in flight at once), and the copies
// into slots and the replicated experts' gradient sums on random placements.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "mpi_comm/expert_dispatch.h"
#include "mpi_comm/topology.h"
#include "src/runtime/expert_migration.h"
#include "src/runtime/expert_replicas.h"
#include "src/sim/dispatch_replay.h"
#include "tests/mpi/mpi_test_util.h"

namespace rlf {
namespace {

using test::world_rank;
using test::world_size;

constexpr int kTopK = 2, kWidth = 3;

// One dispatch's inputs on this rank: a skewed router (low experts more often), distinct experts
// per token.
struct Tokens {
  int N = 0;
  std::vector<int> idx;
  std::vector<float> x, weights, dout;
};

Tokens draw_tokens(std::mt19937_64& rng, int experts, int max_tokens) {
  Tokens t;
  t.N = world_rank() == 1 ? 0 : int(rng() % uint64_t(max_tokens + 1));
  std::uniform_real_distribution<float> value(-1, 1);
  for (int n = 0; n < t.N; ++n) {
    std::set<int> used;
    while (int(used.size()) < kTopK) {
      const int e = int(std::min(rng() % uint64_t(experts), rng() % uint64_t(experts)));
      if (used.insert(e).second) t.idx.push_back(e);
    }
    for (int k = 0; k < kTopK; ++k) t.weights.push_back(value(rng));
    for (int c = 0; c < kWidth; ++c) {
      t.x.push_back(value(rng));
      t.dout.push_back(value(rng));
    }
  }
  return t;
}

// Every rank's routing log, on every rank.
std::vector<std::vector<int32_t>> every_log(const std::vector<int32_t>& mine) {
  const int P = world_size();
  int count = int(mine.size());
  std::vector<int> counts(static_cast<size_t>(P)), offsets(static_cast<size_t>(P), 0);
  MPI_Allgather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, MPI_COMM_WORLD);
  for (int r = 1; r < P; ++r) offsets[size_t(r)] = offsets[size_t(r) - 1] + counts[size_t(r) - 1];
  std::vector<int32_t> all(size_t(offsets.back() + counts.back()));
  MPI_Allgatherv(mine.data(), count, MPI_INT32_T, all.data(), counts.data(), offsets.data(),
                 MPI_INT32_T, MPI_COMM_WORLD);
  std::vector<std::vector<int32_t>> logs;
  for (int r = 0; r < P; ++r) {
    logs.emplace_back(all.begin() + offsets[size_t(r)],
                      all.begin() + offsets[size_t(r)] + counts[size_t(r)]);
  }
  return logs;
}

// Forward and backward through `d` on `t`, or only forward (generation).
void run_operations(ExpertDispatcher& d, const Tokens& t, bool backward) {
  std::vector<float> rows = d.dispatch(t.x.data(), t.idx.data(), t.N, kTopK, kWidth);
  d.combine(rows.data(), t.weights.data());
  if (!backward) return;
  std::vector<float> dy, dweight;
  d.combine_backward(t.dout.data(), rows.data(), t.weights.data(), dy, dweight);
  d.dispatch_backward(dy.data());
}

TEST(RoutingReplay, MatchesTheDispatchersCountersOnFreshRandomRouting) {
  const int P = world_size(), rank = world_rank();
  uint64_t seed = std::random_device{}();
  MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int E = 2 * P;
  for (int ranks_per_node : {1, 2}) {
    if (P % ranks_per_node != 0) continue;
    SCOPED_TRACE("ranks per node " + std::to_string(ranks_per_node));
    Links links(test::virtual_node_list(P, ranks_per_node), {});
    links.record_routing();
    HierarchicalComm h = make_hierarchical(MPI_COMM_WORLD, links);
    std::mt19937_64 rng(seed ^ (uint64_t(rank) * 0x9E3779B97F4A7C15ull + uint64_t(ranks_per_node)));
    for (DispatchMode mode :
         {DispatchMode::Flat, DispatchMode::FlatDedup, DispatchMode::Hierarchical}) {
      for (int spare : {0, 1}) {
        if (spare > 0 && P == 1) continue;  // one rank holds every expert: no room for a replica
        ExpertDispatcher d(h, links, E, mode, 0, spare);
        // Training's step: forward and backward.
        run_operations(d, draw_tokens(rng, E, 12), true);
        // The slots change (EDPB's moves; with spare slots, other replicas), then generation's.
        if (spare == 0) {
          std::vector<int> slot_of(static_cast<size_t>(E));
          for (int e = 0; e < E; ++e) slot_of[size_t(e)] = (e + 1) % E;
          d.set_expert_slots(slot_of);
        } else {
          std::vector<int> slot_expert;
          for (int r = 0; r < P; ++r)
            slot_expert.insert(slot_expert.end(), {2 * r, 2 * r + 1, (2 * r + 3) % E});
          d.set_slot_experts(slot_expert);
        }
        run_operations(d, draw_tokens(rng, E, 12), false);
        // Two dispatchers in flight at once (a chunked pipeline's), their records interleaved.
        ExpertDispatcher other(h, links, E, mode, 0, spare);
        const Tokens a = draw_tokens(rng, E, 8), b = draw_tokens(rng, E, 8);
        d.begin_dispatch(a.x.data(), a.idx.data(), a.N, kTopK, kWidth);
        other.begin_dispatch(b.x.data(), b.idx.data(), b.N, kTopK, kWidth);
        const std::vector<float> rows_b = other.finish_dispatch();
        const std::vector<float> rows_a = d.finish_dispatch();
        other.begin_combine(rows_b.data(), b.weights.data());
        d.begin_combine(rows_a.data(), a.weights.data());
        d.finish_combine();
        other.finish_combine();
      }
    }
    const sim::ReplayedDispatch replayed =
        sim::replay_dispatch_bytes(every_log(links.routing_log()->records()));
    const LinkCounters counted = test::world_total(links.counters(TrafficKind::ExpertDispatch));
    EXPECT_EQ(replayed.intra, counted.bytes[0]);
    EXPECT_EQ(replayed.inter, counted.bytes[1]);
    EXPECT_GT(replayed.dispatches, 0);
    // Nothing else was sent: every byte on these links is a dispatcher's.
    EXPECT_EQ(test::world_total(links.counters()).bytes, counted.bytes);
    free_hierarchical(h);
  }
}

// A random placement of E = 2 P experts over P ranks of L = 3 slots: the experts shuffled over
// the first two slots of every rank, each rank's spare slot a random other expert.
std::vector<int> random_placement(std::mt19937_64& rng, int P) {
  const int E = 2 * P;
  std::vector<int> experts(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) experts[size_t(e)] = e;
  std::shuffle(experts.begin(), experts.end(), rng);
  std::vector<int> table;
  for (int r = 0; r < P; ++r) {
    const int a = experts[size_t(2 * r)], b = experts[size_t(2 * r + 1)];
    int spare = a;
    while (spare == a || spare == b) spare = int(rng() % uint64_t(E));
    table.insert(table.end(), {a, b, spare});
  }
  return table;
}

TEST(RoutingReplay, SlotCopiesAndReplicaSumsMatchTheCountersOnRandomPlacements) {
  const int P = world_size();
  if (P < 2) GTEST_SKIP() << "a spare slot needs another rank's experts";
  uint64_t seed = std::random_device{}();
  MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);  // the same placements on every rank
  constexpr int kSlots = 3, kLayers = 2, kFloats = 5;
  Links links(test::virtual_node_list(P, P % 2 == 0 ? 2 : 1), {});
  links.record_routing();
  // Every rank stores both layers' 3 slots, 5 floats each, in 3 buffers (weights, 2 moments).
  std::vector<std::vector<ParameterRange>> ranges;
  for (int l = 0; l < kLayers; ++l)
    for (int i = 0; i < kSlots; ++i)
      ranges.push_back({{int64_t(l * kSlots + i) * kFloats, kFloats}});
  std::vector<std::vector<float>> buffers(3, std::vector<float>(kLayers * kSlots * kFloats, 1.0f));
  std::vector<float*> pointers;
  for (std::vector<float>& b : buffers) pointers.push_back(b.data());
  std::vector<std::vector<int>> table(kLayers, default_slot_experts(2 * P, P, 1));
  for (int move = 0; move < 3; ++move) {
    std::vector<std::vector<int>> next;
    for (int l = 0; l < kLayers; ++l) next.push_back(random_placement(rng, P));
    {
      const TrafficScope scope(links, TrafficKind::ExpertMigration);
      copy_experts_into_slots(table, next, 2 * P, kSlots, ranges, pointers, MPI_COMM_WORLD, &links);
    }
    table = next;
    const TrafficScope scope(links, TrafficKind::GradientReduce);
    sum_replica_gradients(table, 2 * P, kSlots, ranges, buffers[0].data(), MPI_COMM_WORLD, &links);
  }
  const sim::ReplayedDispatch replayed =
      sim::replay_dispatch_bytes(every_log(links.routing_log()->records()));
  ASSERT_TRUE(replayed.placement_logged);
  const LinkCounters moved = test::world_total(links.counters(TrafficKind::ExpertMigration));
  const LinkCounters summed = test::world_total(links.counters(TrafficKind::GradientReduce));
  EXPECT_EQ(replayed.migration_intra, moved.bytes[0]);
  EXPECT_EQ(replayed.migration_inter, moved.bytes[1]);
  EXPECT_EQ(replayed.replica_sums_intra, summed.bytes[0]);
  EXPECT_EQ(replayed.replica_sums_inter, summed.bytes[1]);
  EXPECT_GT(moved.bytes[0] + moved.bytes[1], 0u);
  EXPECT_GT(summed.bytes[0] + summed.bytes[1], 0u);
}

}  // namespace
}  // namespace rlf
