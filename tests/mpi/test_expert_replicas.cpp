// Replicas of hot experts in redundant slots: the two-level placement of the routing's loads
// (hot experts replicated), the replicas copied in with their AdamW moments
// (copy_experts_into_slots), the dispatcher splitting their tokens among the copies, the
// replicas' gradients summed (sum_replica_gradients) and the norm counting each expert once
// (counts_in_norm), in every dispatch mode. Against the single-rank MoE computed on every rank from
// the global inputs: outputs and input gradients bit for bit, weight gradients and two AdamW steps
// within 1e-4 relative; the replicas of an expert must stay bit-identical.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/adamw.h"
#include "kernels/error.h"
#include "kernels/moe.h"
#include "mpi_comm/expert_dispatch.h"
#include "mpi_comm/topology.h"
#include "src/balance/expert_placement.h"
#include "src/runtime/expert_migration.h"
#include "src/runtime/expert_replicas.h"
#include "tests/mpi/mpi_test_util.h"

namespace rlf {
namespace {

using test::hash;
using test::world_rank;
using test::world_size;

constexpr int kK = 2, kC = 6, kF = 5;
constexpr int64_t kSlotSize = 3 * int64_t(kF) * kC;  // w1 | w3 | w2 of one expert

float value(uint64_t a, uint64_t b, uint64_t c) {
  return float(int64_t(hash(a, b, c) % 20001) - 10000) / 20000.0f;
}

int tokens_of(int rank) {
  return rank == 1 ? 0 : 9 + 4 * rank;  // rank 1 brings no tokens
}

// Tokens of every rank (rank-major), routed mostly to experts 0 and 1, and the expert weights.
struct Global {
  int E = 0, N = 0;
  std::vector<int> first_token, idx;
  std::vector<float> x, w, dout, weights;  // weights: [E][w1 | w3 | w2]
};

Global make_global(int ranks, int E) {
  Global g;
  g.E = E;
  for (int r = 0; r < ranks; ++r) {
    g.first_token.push_back(g.N);
    for (int n = 0; n < tokens_of(r); ++n) {
      const uint64_t h = hash(r, n, 99);
      const int first = h % 4 != 0 ? 0 : int(hash(r, n, 98) % uint64_t(E));
      int second = h % 3 != 0 ? 1 : int(hash(r, n, 97) % uint64_t(E));
      if (second == first) second = (first + 1) % E;
      g.idx.insert(g.idx.end(), {first, second});
      g.w.insert(g.w.end(), {0.5f + value(r, n, 50), 0.25f + value(r, n, 51)});
      for (int c = 0; c < kC; ++c) {
        g.x.push_back(2 * value(r, n, c));
        g.dout.push_back(value(r, n, 300 + c));
      }
    }
    g.N += tokens_of(r);
  }
  g.first_token.push_back(g.N);
  for (int64_t i = 0; i < E * kSlotSize; ++i) g.weights.push_back(value(5, uint64_t(i), 0));
  return g;
}

// Per-expert pointers into [count][w1 | w3 | w2] blocks.
struct ExpertPointers {
  std::vector<float*> w1, w3, w2;
  ExpertPointers(float* blocks, int count) {
    for (int e = 0; e < count; ++e) {
      float* b = blocks + e * kSlotSize;
      w1.push_back(b);
      w3.push_back(b + kF * kC);
      w2.push_back(b + 2 * kF * kC);
    }
  }
};

const float* const* in(const std::vector<float*>& v) {
  return const_cast<const float* const*>(v.data());
}

bool same_bits(const float* a, const float* b, size_t n) {
  return n == 0 || std::memcmp(a, b, n * sizeof(float)) == 0;
}

// Weight gradients add the replicas' partial sums in another order: a tight tolerance.
void expect_near(const float* got, const float* want, size_t n, const char* what) {
  int shown = 0;
  for (size_t i = 0; i < n; ++i) {
    const float tolerance = 1e-5f + 1e-4f * std::fabs(want[i]);
    if (!(std::fabs(got[i] - want[i]) <= tolerance) && shown++ < 4) {
      ADD_FAILURE() << what << "[" << i << "]: " << got[i] << " vs " << want[i];
    }
  }
}

// The placement `bench balance` and the rebalancer plan (two-level, replicas by load) for the
// routing's token counts on P devices of L slots: its device-major slot list is the
// dispatcher's slot table.
std::vector<int> planned_table(const Global& g, int P, int L) {
  std::vector<double> load(size_t(g.E), 0.0);
  for (int e : g.idx) load[size_t(e)] += 1;
  const Placement placement = place_two_level(load, ExpertCluster{1, P, L});
  EXPECT_TRUE(placement.valid());
  return placement.slot_expert;
}

struct AdamState {
  std::vector<float> params, m, v;
};

// One AdamW step (clipped at 0.05, weight decay on) with the given global gradient norm.
void adam_step(AdamState& s, const float* grads, int64_t n, double norm, int step) {
  AdamWHyper hyper;
  hyper.learning_rate = 1e-2f;
  hyper.weight_decay = 0.1f;
  ref::adamw_update(s.params.data(), grads, s.m.data(), s.v.data(), n, hyper, step,
                    clip_scale(norm, 0.05f));
}

TEST(ExpertReplicas, SplitTokensSumGradientsAndStayIdentical) {
  const int P = world_size(), rank = world_rank();
  const int E = 2 * P, own = 2, R = std::min(1, E - own), L = own + R;
  Links links(test::virtual_node_list(P, P % 2 == 0 ? 2 : 1), {});
  HierarchicalComm h = make_hierarchical(MPI_COMM_WORLD, links);
  const Global g = make_global(P, E);
  const int M = g.N * kK;

  // Single-rank reference.
  std::vector<int> offsets(size_t(E) + 1), row_of(static_cast<size_t>(M)),
      token_of(static_cast<size_t>(M));
  moe_build_routing(offsets.data(), row_of.data(), token_of.data(), g.idx.data(), g.N, E, kK);
  std::vector<float> weights = g.weights;
  ExpertPointers full(weights.data(), E);
  std::vector<float> xg(size_t(M) * kC), a(size_t(M) * kF), b(size_t(M) * kF), y(size_t(M) * kC);
  ref::moe_gather(xg.data(), g.x.data(), token_of.data(), M, kC);
  ref::expert_ffn_forward(y.data(), a.data(), b.data(), xg.data(), in(full.w1), in(full.w3),
                          in(full.w2), offsets.data(), E, kC, kF);
  std::vector<float> ref_out(size_t(g.N) * kC);
  ref::moe_combine(ref_out.data(), y.data(), g.w.data(), row_of.data(), g.N, kK, kC);
  std::vector<float> dy(size_t(M) * kC, 0), ref_dw(size_t(M), 0), dxg(size_t(M) * kC, 0);
  ref::moe_combine_backward(dy.data(), ref_dw.data(), g.dout.data(), y.data(), g.w.data(),
                            row_of.data(), g.N, kK, kC);
  std::vector<float> ref_grads(size_t(E * kSlotSize), 0), ref_dx(size_t(g.N) * kC, 0);
  ExpertPointers full_grads(ref_grads.data(), E);
  ref::expert_ffn_backward(dxg.data(), full_grads.w1.data(), full_grads.w3.data(),
                           full_grads.w2.data(), dy.data(), xg.data(), a.data(), b.data(),
                           in(full.w1), in(full.w3), in(full.w2), offsets.data(), E, kC, kF);
  ref::moe_gather_backward(ref_dx.data(), dxg.data(), row_of.data(), g.N, kK, kC);

  // Expert parallel with replicas: the slots start in another placement (with a first moment
  // of 2 w and a second of w^2 as stand-ins), then the planned one's experts are copied in from
  // their holders (copy_experts_into_slots).
  std::vector<int> start = default_slot_experts(E, P, R);
  for (int r = 0; r < P; ++r) {  // spare slots: the next rank's experts from its last one down
    for (int j = 0; j < R; ++j) start[size_t(r * L + own + j)] = ((r + 1) * own + own - 1 - j) % E;
  }
  const std::vector<int> table = planned_table(g, P, L);
  if (P > 1) {
    EXPECT_GT(std::count(table.begin(), table.end(), 0), 1) << "the hottest expert has no replica";
  }
  std::vector<float> slots(size_t(L * kSlotSize)), first_moment(slots.size()),
      second_moment(slots.size());
  for (int i = 0; i < L; ++i) {
    const float* w = g.weights.data() + start[size_t(rank * L + i)] * kSlotSize;
    for (int64_t j = 0; j < kSlotSize; ++j) {
      slots[size_t(i * kSlotSize + j)] = w[j];
      first_moment[size_t(i * kSlotSize + j)] = 2 * w[j];
      second_moment[size_t(i * kSlotSize + j)] = w[j] * w[j];
    }
  }
  std::vector<std::vector<ParameterRange>> slot_ranges;
  for (int i = 0; i < L; ++i) slot_ranges.push_back({{i * kSlotSize, kSlotSize}});
  const uint64_t copied =
      copy_experts_into_slots({start}, {table}, E, L, slot_ranges,
                              {slots.data(), first_moment.data(), second_moment.data()}, h.comm);
  for (int i = 0; i < L; ++i) {
    const int e = table[size_t(rank * L + i)];
    const float* w = g.weights.data() + e * kSlotSize;
    for (int64_t j = 0; j < kSlotSize; ++j) {
      const size_t at = size_t(i * kSlotSize + j);
      ASSERT_EQ(slots[at], w[j]) << "slot " << i << " after copying in expert " << e;
      ASSERT_EQ(first_moment[at], 2 * w[j]);
      ASSERT_EQ(second_moment[at], w[j] * w[j]);
    }
  }
  // One message per changed slot whose new expert was on no slot of its rank.
  uint64_t remote_copies = 0, copied_everywhere = 0;
  for (size_t s = 0; s < table.size(); ++s) {
    bool on_rank = false;
    for (size_t t = 0; t < start.size(); ++t)
      on_rank = on_rank || (start[t] == table[s] && int(t) / L == int(s) / L);
    remote_copies += table[s] != start[s] && !on_rank;
  }
  MPI_Allreduce(&copied, &copied_everywhere, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(copied_everywhere, remote_copies * 3 * kSlotSize * sizeof(float));
  if (P > 1) {
    EXPECT_GT(remote_copies, 0u);
  }
  // Every dispatch mode (hierarchical with two ranks per virtual node where they divide).
  std::vector<float> grads;
  for (DispatchMode mode :
       {DispatchMode::Flat, DispatchMode::FlatDedup, DispatchMode::Hierarchical}) {
    SCOPED_TRACE(dispatch_mode_name(mode));
    ExpertDispatcher d(h, links, E, mode, 0, R);
    ASSERT_EQ(d.local_experts(), L);
    d.set_slot_experts(table);
    ExpertPointers local(slots.data(), L);
    const int n0 = g.first_token[size_t(rank)], N = tokens_of(rank);
    std::vector<float> rows =
        d.dispatch(g.x.data() + int64_t(n0) * kC, g.idx.data() + int64_t(n0) * kK, N, kK, kC);
    const int rows_here = d.local_rows();
    std::vector<float> la(size_t(rows_here) * kF), lb(size_t(rows_here) * kF),
        ly(size_t(rows_here) * kC);
    ref::expert_ffn_forward(ly.data(), la.data(), lb.data(), rows.data(), in(local.w1),
                            in(local.w3), in(local.w2), d.local_expert_offsets().data(), L, kC, kF);
    const std::vector<float> out = d.combine(ly.data(), g.w.data() + int64_t(n0) * kK);
    // Each assignment is computed by one replica with the expert's weights, row by row (the
    // reference kernels), so outputs and input gradients keep the single copy's bits.
    EXPECT_TRUE(same_bits(out.data(), ref_out.data() + int64_t(n0) * kC, out.size()));

    // Every replica of the hottest expert got a share of its rows (each rank with tokens routes
    // most of them to expert 0 and starts its turns at a different replica).
    for (int i = 0; i < L; ++i) {
      if (table[size_t(rank * L + i)] == 0) {
        EXPECT_GT(d.local_expert_offsets()[size_t(i) + 1], d.local_expert_offsets()[size_t(i)])
            << "a replica of expert 0 got no rows";
      }
    }

    std::vector<float> ldy, ldw;
    d.combine_backward(g.dout.data() + int64_t(n0) * kC, ly.data(), g.w.data() + int64_t(n0) * kK,
                       ldy, ldw);
    EXPECT_TRUE(same_bits(ldw.data(), ref_dw.data() + int64_t(n0) * kK, ldw.size()));
    grads.assign(slots.size(), 0.0f);
    std::vector<float> ldxg(size_t(rows_here) * kC, 0.0f);
    ExpertPointers local_grads(grads.data(), L);
    ref::expert_ffn_backward(ldxg.data(), local_grads.w1.data(), local_grads.w3.data(),
                             local_grads.w2.data(), ldy.data(), rows.data(), la.data(), lb.data(),
                             in(local.w1), in(local.w3), in(local.w2),
                             d.local_expert_offsets().data(), L, kC, kF);
    const std::vector<float> dx = d.dispatch_backward(ldxg.data());
    EXPECT_TRUE(same_bits(dx.data(), ref_dx.data() + int64_t(n0) * kC, dx.size()));

    sum_replica_gradients({table}, E, L, slot_ranges, grads.data(), d.comm());
    for (int i = 0; i < L; ++i) {
      const int e = table[size_t(rank * L + i)];
      expect_near(grads.data() + i * kSlotSize, ref_grads.data() + e * kSlotSize, kSlotSize,
                  "summed expert gradient");
    }
  }

  // Global norm with every expert once, then two clipped AdamW steps on every slot.
  const std::vector<bool> counted = counts_in_norm({table}, E, L, rank);
  double norm2 = 0;
  for (int i = 0; i < L; ++i)
    if (counted[size_t(i)])
      norm2 += ref::grad_norm_squared(grads.data() + i * kSlotSize, kSlotSize);
  MPI_Allreduce(MPI_IN_PLACE, &norm2, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  const double ref_norm = std::sqrt(ref::grad_norm_squared(ref_grads.data(), E * kSlotSize));
  EXPECT_NEAR(std::sqrt(norm2), ref_norm, 1e-5 * ref_norm);
  AdamState mine{slots, std::vector<float>(slots.size(), 0), std::vector<float>(slots.size(), 0)};
  AdamState single{g.weights, std::vector<float>(g.weights.size(), 0),
                   std::vector<float>(g.weights.size(), 0)};
  for (int step = 1; step <= 2; ++step) {
    adam_step(mine, grads.data(), int64_t(grads.size()), std::sqrt(norm2), step);
    adam_step(single, ref_grads.data(), int64_t(ref_grads.size()), ref_norm, step);
  }
  std::vector<float> all(size_t(P) * mine.params.size());
  MPI_Allgather(mine.params.data(), int(mine.params.size()), MPI_FLOAT, all.data(),
                int(mine.params.size()), MPI_FLOAT, MPI_COMM_WORLD);
  for (int s = 0; s < P * L; ++s) {
    const int e = table[size_t(s)];
    const float* got = all.data() + s * kSlotSize;
    expect_near(got, single.params.data() + e * kSlotSize, kSlotSize, "AdamW step");
    const int first_copy = int(std::find(table.begin(), table.end(), e) - table.begin());
    EXPECT_EQ(std::memcmp(got, all.data() + first_copy * kSlotSize, kSlotSize * sizeof(float)), 0)
        << "slot " << s << " differs from slot " << first_copy << " (both expert " << e << ")";
  }
  free_hierarchical(h);
}

TEST(ExpertReplicas, BadRedundantSlotsFailOnEveryRank) {
  const int P = world_size();
  Links links(test::virtual_node_list(P, 1), {});
  HierarchicalComm h = make_hierarchical(MPI_COMM_WORLD, links);
  const int E = 2 * P;
  test::expect_config_error_everywhere(
      [&] { ExpertDispatcher d(h, links, E, DispatchMode::Flat, 0, -1); }, "--redundant-experts");
  test::expect_config_error_everywhere(
      [&] { ExpertDispatcher d(h, links, E, DispatchMode::Flat, 0, E - 1); },
      "--redundant-experts");
  free_hierarchical(h);
}

TEST(ExpertReplicas, SlotTablesAreChecked) {
  const int P = world_size();
  if (P < 2) GTEST_SKIP() << "needs two ranks for a redundant slot";
  Links links(test::virtual_node_list(P, 1), {});
  HierarchicalComm h = make_hierarchical(MPI_COMM_WORLD, links);
  const int E = 2 * P;
  ExpertDispatcher d(h, links, E, DispatchMode::Flat, 0, 1);
  std::vector<int> table = default_slot_experts(E, P, 1);
  std::vector<int> twice_on_rank = table;
  twice_on_rank[2] = 0;  // rank 0 holds expert 0 in slots 0 and 2
  EXPECT_THROW(d.set_slot_experts(twice_on_rank), std::invalid_argument);
  std::vector<int> missing = table;
  for (int& e : missing)
    if (e == E - 1) e = 0;  // expert E - 1 without a slot (and 0 maybe twice on a rank)
  EXPECT_THROW(d.set_slot_experts(missing), std::invalid_argument);
  EXPECT_THROW(d.set_expert_slots(std::vector<int>(size_t(E), 0)), std::invalid_argument);
  EXPECT_NO_THROW(d.set_slot_experts(table));
  free_hierarchical(h);
}

}  // namespace
}  // namespace rlf
