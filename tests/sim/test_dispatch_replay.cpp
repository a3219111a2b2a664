// The expert dispatchers' bytes derived from routing logs (src/sim/dispatch_replay.h) against
// hand-computed cases: every message of each operation, the hierarchical mode's two stages, a
// replicated expert's turns, and malformed logs. tests/mpi/test_routing_replay.cpp checks the
// derivation against the dispatchers' own counters on random routing.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "mpi_comm/expert_dispatch.h"
#include "mpi_comm/routing_log.h"
#include "src/sim/dispatch_replay.h"

namespace rlf::sim {
namespace {

constexpr int kRowWidth = 4;  // floats: 16-byte rows

// Rank `ep_rank`'s log of one dispatcher with the given slot table, one dispatch of `experts`
// (token-major, `top_k` per token) and then `operations` on its plan.
std::vector<int32_t> one_dispatch(DispatchMode mode, int ep_rank, int experts, int slots_per_rank,
                                  const std::vector<int>& links_node,
                                  const std::vector<int>& group_node,
                                  const std::vector<int>& local_index,
                                  const std::vector<int>& slot_expert, int top_k,
                                  const std::vector<int>& routed,
                                  const std::vector<RoutingRecord>& operations) {
  RoutingLog log;
  const int32_t id = log.add_dispatcher(int32_t(mode), ep_rank, experts, slots_per_rank, links_node,
                                        group_node, local_index);
  log.slots(id, slot_expert);
  log.dispatch(id, int(routed.size()) / top_k, top_k, kRowWidth, routed.data());
  for (RoutingRecord operation : operations) log.operation(id, operation);
  return log.take();
}

TEST(DispatchReplay, FlatDedupSendsOnePacketPerOwnerAndEveryOperationsMessagesByHand) {
  // 2 EP ranks on 2 nodes, 4 experts (2 a rank), top-2. Rank 0's tokens go to experts {0, 2} and
  // {3, 2}: one packet to rank 1 each (the second carrying 2 assignments), expert 0 at home.
  // Rank 1 has no tokens.
  const std::vector<RoutingRecord> all = {RoutingRecord::Combine, RoutingRecord::CombineBackward,
                                          RoutingRecord::DispatchBackward};
  const std::vector<std::vector<int32_t>> logs = {
      one_dispatch(DispatchMode::FlatDedup, 0, 4, 2, {0, 1}, {0, 1}, {0, 0}, {0, 1, 2, 3}, 2,
                   {0, 2, 3, 2}, all),
      one_dispatch(DispatchMode::FlatDedup, 1, 4, 2, {0, 1}, {0, 1}, {0, 0}, {0, 1, 2, 3}, 2, {},
                   all)};
  const ReplayedDispatch got = replay_dispatch_bytes(logs);
  // Rank 0 -> 1: 2 packets, 3 assignments.
  const uint64_t dispatch = 8 + (12 * 2 + 8 * 3) + 16 * 2;   // counts, metadata, rows
  const uint64_t combine = 16 * 3;                           // a row per assignment back
  const uint64_t combine_backward = 16 * 2 + 4 * 3 + 4 * 3;  // dout rows, weights, their grads
  const uint64_t dispatch_backward = 16 * 3;
  const uint64_t rank1_counts = 8;
  EXPECT_EQ(got.inter, dispatch + combine + combine_backward + dispatch_backward + rank1_counts);
  EXPECT_EQ(got.intra, 0u);
  EXPECT_EQ(got.dispatches, 2);
  EXPECT_EQ(got.tokens, 2);
  EXPECT_EQ(got.assignments, 4);
  EXPECT_EQ(got.remote_rows, 2);  // one other owner per token
}

TEST(DispatchReplay, HierarchicalCrossesOncePerNodeThenSplitsByOwnerByHand) {
  // 4 EP ranks, 2 a node, one expert each. Rank 0's one token goes to experts 2 and 3 (node 1):
  // one packet to rank 2 (its local index on node 1) with both assignments, which rank 2 splits,
  // keeping its own and forwarding one to rank 3. Every rank sends a count message to its peer
  // on the other node and to its neighbour on its own.
  std::vector<std::vector<int32_t>> logs;
  for (int rank = 0; rank < 4; ++rank) {
    const std::vector<int> routed = rank == 0 ? std::vector<int>{2, 3} : std::vector<int>{};
    logs.push_back(one_dispatch(DispatchMode::Hierarchical, rank, 4, 1, {0, 0, 1, 1}, {0, 0, 1, 1},
                                {0, 1, 0, 1}, {0, 1, 2, 3}, 2, routed,
                                {RoutingRecord::DispatchBackward}));
  }
  const ReplayedDispatch got = replay_dispatch_bytes(logs);
  const uint64_t across = (12 + 8 * 2) + 16 + 16 * 2;  // 0 -> 2, and 2 rows back
  const uint64_t inside = (12 + 8) + 16 + 16;          // 2 -> 3, and 1 row back
  EXPECT_EQ(got.inter, across + 4 * 8);
  EXPECT_EQ(got.intra, inside + 4 * 8);
  EXPECT_EQ(got.remote_rows, 2);  // two other owners, whatever the path
}

TEST(DispatchReplay, AReplicatedExpertsAssignmentsTakeTurnsFromTheRanksOwnReplicaByHand) {
  // 2 EP ranks on one node, 2 experts, a spare slot each (default_slot_experts: {0, 1 | 1, 0}),
  // flat. Rank 0's two tokens of expert 0 go to slots 0 (home) and 3 (rank 1); rank 1's three
  // tokens of expert 1 to slots 2, 1, 2 (turns 1, 2, 3 mod 2): one row each way.
  const std::vector<int> slot_expert = default_slot_experts(2, 2, 1);
  ASSERT_EQ(slot_expert, (std::vector<int>{0, 1, 1, 0}));
  const std::vector<std::vector<int32_t>> logs = {
      one_dispatch(DispatchMode::Flat, 0, 2, 2, {0, 0}, {0, 0}, {0, 1}, slot_expert, 1, {0, 0}, {}),
      one_dispatch(DispatchMode::Flat, 1, 2, 2, {0, 0}, {0, 0}, {0, 1}, slot_expert, 1, {1, 1, 1},
                   {})};
  const ReplayedDispatch got = replay_dispatch_bytes(logs);
  EXPECT_EQ(got.intra, 2 * (8 + (12 + 8) + 16));
  EXPECT_EQ(got.inter, 0u);
  EXPECT_EQ(got.remote_rows, 2);
}

TEST(DispatchReplay, WhatFollowsThePlacementByHand) {
  // 2 EP ranks on 2 nodes, 4 experts (2 a rank). Slot copies (EDPB swapping experts 1 and 3, 3
  // buffers of 10 floats a slot; a second layer another stage stores): each rank receives one.
  std::vector<RoutingLog> logs(2);
  for (int rank = 0; rank < 2; ++rank) {
    logs[size_t(rank)].slot_copies(rank, 2, 4, 3, {0, 1}, {{0, 1, 2, 3}, {0, 1, 2, 3}},
                                   {{0, 3, 2, 1}, {0, 3, 2, 1}}, {{10, 10}, {0, 0}});
  }
  // Replica sums: 3 slots a rank, experts 0 and 2 on both ranks (5 floats a slot): each rank
  // sends its 2 replicated slices to the other.
  for (int rank = 0; rank < 2; ++rank)
    logs[size_t(rank)].replica_sums(rank, 3, 4, {0, 0}, {{0, 1, 2, 2, 3, 0}}, {{5, 5, 5}});
  // A switch to generation EP 1 (30 floats an expert) from training slots {0, 1, 3 | 2, 3, 0}:
  // rank 0 takes expert 2 from rank 1 and holds the others (3 in its spare slot); rank 1 takes
  // expert 1 from rank 0 (its spare slot holds a replica of 0).
  logs[0].expert_switch(0, 3, 4, 30, {0, 1}, {{0, 1, 3, 2, 3, 0}}, {{0, 1, 2, 3}});
  logs[1].expert_switch(1, 3, 4, 30, {0, 1}, {{0, 1, 3, 2, 3, 0}}, {{0, 1, 2, 3}});
  // The weight sync of 2 EP learners (2 slots each, identity tables, 2 layers, 7 floats an
  // expert) to 2 actors at EP 1, one on learner 0's node: learner 0 sends the tables (32 B) and
  // experts 0 and 1 of both layers (4 x 28 B), learner 1 experts 2 and 3.
  logs[0].expert_sync(0, 2, 4, 1, 1, 2, 7, true, 0, {1, 0}, {0, 1, 2, 3, 0, 1, 2, 3});
  logs[1].expert_sync(1, 2, 4, 1, 1, 2, 7, false, 1, {1, 0}, {0, 1, 2, 3, 0, 1, 2, 3});
  const ReplayedDispatch got = replay_dispatch_bytes({logs[0].take(), logs[1].take()});
  EXPECT_TRUE(got.placement_logged);
  EXPECT_EQ(got.migration_inter, 2u * 10 * 3 * 4);
  EXPECT_EQ(got.migration_intra, 0u);
  EXPECT_EQ(got.replica_sums_intra, 2u * 2 * 5 * 4);
  EXPECT_EQ(got.switch_inter, 2u * 30 * 4);
  EXPECT_EQ(got.switch_intra, 0u);
  // Learner 0 (node 0): actor 0 across, actor 1 inside; learner 1 (node 1) the other way round.
  EXPECT_EQ(got.sync_inter, (32u + 4 * 28) + 4 * 28);
  EXPECT_EQ(got.sync_intra, (32u + 4 * 28) + 4 * 28);
  EXPECT_EQ(got.dispatches, 0);
  // A log of the first format (no format record) did not hold these.
  std::vector<int32_t> first_format =
      one_dispatch(DispatchMode::Flat, 0, 2, 1, {0, 0}, {0, 0}, {0, 1}, {0, 1}, 1, {1}, {});
  ASSERT_EQ(first_format[0], int32_t(RoutingRecord::Format));
  first_format.erase(first_format.begin(), first_format.begin() + 2);
  EXPECT_FALSE(replay_dispatch_bytes({first_format, {}}).placement_logged);
}

TEST(DispatchReplay, AMalformedLogIsRefusedNamingItsRank) {
  std::vector<int32_t> good =
      one_dispatch(DispatchMode::Flat, 0, 2, 1, {0, 0}, {0, 0}, {0, 1}, {0, 1}, 1, {1}, {});
  auto refusal = [&](const std::vector<int32_t>& bad) {
    try {
      replay_dispatch_bytes({good, bad});
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  std::vector<int32_t> truncated = good;
  truncated.pop_back();
  EXPECT_NE(refusal(truncated).find("rank 1"), std::string::npos) << refusal(truncated);
  EXPECT_NE(refusal(truncated).find("ends inside a record"), std::string::npos);
  EXPECT_NE(refusal({int32_t(RoutingRecord::Combine), 0}).find("an unknown dispatcher"),
            std::string::npos);
  std::vector<int32_t> wrong_expert = good;
  wrong_expert.back() = 7;  // the dispatch's expert id, of 2 experts
  EXPECT_NE(refusal(wrong_expert).find("expert 7 outside [0, 1]"), std::string::npos)
      << refusal(wrong_expert);
  std::vector<int32_t> too_large = good;
  too_large[5] = 5;  // (after the format record) an EP group of 5 in a run of 2 ranks
  EXPECT_NE(refusal(too_large).find("EP size 5 outside [1, 2]"), std::string::npos)
      << refusal(too_large);
  std::vector<int32_t> early = good;
  early.resize(early.size() - 6);  // without the dispatch (5 values and 1 id) ...
  early.insert(early.end(), {int32_t(RoutingRecord::Combine), 0});
  EXPECT_NE(refusal(early).find("before the dispatcher's first dispatch"), std::string::npos)
      << refusal(early);
}

}  // namespace
}  // namespace rlf::sim
