// Expert-parallel dispatch/combine: every mode against the single-rank MoE reference computed on
// every rank from the global inputs (bit for bit, forward and backward), zero-token ranks and
// idle experts, inter-node bytes against counts made here from the routing, and bad EP layouts.
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kernels/moe.h"
#include "mpi_comm/expert_dispatch.h"
#include "mpi_comm/topology.h"
#include "tests/mpi/mpi_test_util.h"

namespace rlf {
namespace {

using test::hash;
using test::world_rank;
using test::world_size;

constexpr int kK = 3, kC = 5;

float value(uint64_t a, uint64_t b, uint64_t c) {
  return float(int64_t(hash(a, b, c) % 20001) - 10000) / 4093.0f;
}

// Rank 1 has no tokens (when it exists); the others have different counts.
int tokens_of(int rank) {
  return rank == 1 ? 0 : 5 + 3 * rank;
}

struct Global {
  int E = 0, N = 0;
  std::vector<int> first_token;  // per rank, rank-major
  std::vector<float> x, w, dout;
  std::vector<int> idx;
};

// Distinct experts per token drawn from [0, E - 2]: expert E - 1 never gets a token.
Global make_global(int ranks, int E) {
  Global g;
  g.E = E;
  for (int r = 0; r < ranks; ++r) {
    g.first_token.push_back(g.N);
    for (int n = 0; n < tokens_of(r); ++n) {
      std::set<int> used;
      for (int k = 0; k < kK; ++k) {
        uint64_t attempt = 0;
        int e = 0;
        do {
          e = int(hash(r, n, 1000 + k * 97 + attempt++) % uint64_t(E - 1));
        } while (used.count(e));
        used.insert(e);
        g.idx.push_back(e);
        g.w.push_back(value(r, n, 50 + k));
      }
      for (int c = 0; c < kC; ++c) {
        g.x.push_back(value(r, n, c));
        g.dout.push_back(value(r, n, 300 + c));
      }
    }
    g.N += tokens_of(r);
  }
  g.first_token.push_back(g.N);
  return g;
}

// The expert "FFN" of the test: row times (expert + 1), identical on every path.
void apply_experts(std::vector<float>& rows, const int* offsets, int experts, int first_expert) {
  for (int e = 0; e < experts; ++e) {
    for (int64_t m = offsets[e]; m < offsets[e + 1]; ++m) {
      for (int c = 0; c < kC; ++c) rows[size_t(m * kC + c)] *= float(first_expert + e + 1);
    }
  }
}

bool same_bits(const float* a, const float* b, size_t n) {
  return n == 0 || std::memcmp(a, b, n * sizeof(float)) == 0;
}

struct Expected {
  uint64_t hierarchical = 0, flat_dedup = 0, flat = 0;  // inter-node rows of dispatch
};

// Counted from the routing alone, independently of the dispatcher's plans.
Expected count_inter_node_rows(const Global& g, int ranks, int ranks_per_node) {
  Expected x;
  const int per_rank = g.E / ranks;
  for (int r = 0; r < ranks; ++r) {
    for (int n = g.first_token[size_t(r)]; n < g.first_token[size_t(r) + 1]; ++n) {
      std::set<int> nodes, owners;
      for (int k = 0; k < kK; ++k) {
        const int owner = g.idx[size_t(n * kK + k)] / per_rank;
        if (owner / ranks_per_node == r / ranks_per_node) continue;
        nodes.insert(owner / ranks_per_node);
        owners.insert(owner);
        ++x.flat;
      }
      x.hierarchical += nodes.size();
      x.flat_dedup += owners.size();
    }
  }
  return x;
}

uint64_t world_sum(uint64_t mine) {
  uint64_t total = 0;
  MPI_Allreduce(&mine, &total, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  return total;
}

void check_against_reference(int ranks_per_node) {
  const int P = world_size(), rank = world_rank();
  if (P % ranks_per_node != 0) GTEST_SKIP() << "virtual nodes do not divide the world";
  Links links(test::virtual_node_list(P, ranks_per_node), {});
  HierarchicalComm h = make_hierarchical(MPI_COMM_WORLD, links);
  const int E = 4 * P, E_local = 4;
  const Global g = make_global(P, E);
  const int M = g.N * kK;

  // Single-rank reference on the concatenated tokens.
  std::vector<int> offsets(size_t(E) + 1), row_of(static_cast<size_t>(M)),
      token_of(static_cast<size_t>(M));
  moe_build_routing(offsets.data(), row_of.data(), token_of.data(), g.idx.data(), g.N, E, kK);
  std::vector<float> xg(size_t(M) * kC), ref_out(size_t(g.N) * kC);
  ref::moe_gather(xg.data(), g.x.data(), token_of.data(), M, kC);
  std::vector<float> y = xg;
  apply_experts(y, offsets.data(), E, 0);
  ref::moe_combine(ref_out.data(), y.data(), g.w.data(), row_of.data(), g.N, kK, kC);
  std::vector<float> ref_dy(size_t(M) * kC, 0), ref_dw(size_t(M), 0), ref_dx(size_t(g.N) * kC, 0);
  ref::moe_combine_backward(ref_dy.data(), ref_dw.data(), g.dout.data(), y.data(), g.w.data(),
                            row_of.data(), g.N, kK, kC);
  std::vector<float> dxg(size_t(M) * kC);
  for (size_t i = 0; i < dxg.size(); ++i) dxg[i] = value(7, i, 0);
  ref::moe_gather_backward(ref_dx.data(), dxg.data(), row_of.data(), g.N, kK, kC);

  const int n0 = g.first_token[size_t(rank)], N = tokens_of(rank);
  const int row0 = offsets[size_t(rank * E_local)], row1 = offsets[size_t((rank + 1) * E_local)];
  const Expected expected = count_inter_node_rows(g, P, ranks_per_node);
  uint64_t remote_slots = expected.flat;
  for (DispatchMode mode :
       {DispatchMode::Flat, DispatchMode::FlatDedup, DispatchMode::Hierarchical}) {
    SCOPED_TRACE(dispatch_mode_name(mode));
    ExpertDispatcher d(h, links, E, mode);
    links.reset_counters();
    std::vector<float> rows =
        d.dispatch(g.x.data() + int64_t(n0) * kC, g.idx.data() + int64_t(n0) * kK, N, kK, kC);
    const uint64_t dispatch_inter = world_sum(d.traffic().payload.bytes[1]);
    ASSERT_EQ(d.local_rows(), row1 - row0);
    for (int e = 0; e <= E_local; ++e) {
      EXPECT_EQ(d.local_expert_offsets()[size_t(e)], offsets[size_t(rank * E_local + e)] - row0);
    }
    EXPECT_TRUE(same_bits(rows.data(), xg.data() + int64_t(row0) * kC, rows.size()));
    if (rank == P - 1) {
      EXPECT_EQ(d.local_expert_offsets()[E_local], d.local_expert_offsets()[E_local - 1]);
    }

    apply_experts(rows, d.local_expert_offsets().data(), E_local, rank * E_local);
    const std::vector<float> out = d.combine(rows.data(), g.w.data() + int64_t(n0) * kK);
    EXPECT_TRUE(same_bits(out.data(), ref_out.data() + int64_t(n0) * kC, out.size()));
    const uint64_t combine_inter = world_sum(d.traffic().payload.bytes[1]) - dispatch_inter;

    std::vector<float> dy, dw;
    d.combine_backward(g.dout.data() + int64_t(n0) * kC, rows.data(), g.w.data() + int64_t(n0) * kK,
                       dy, dw);
    ASSERT_EQ(dy.size(), size_t(row1 - row0) * kC);
    ASSERT_EQ(dw.size(), size_t(N) * kK);
    EXPECT_TRUE(same_bits(dy.data(), ref_dy.data() + int64_t(row0) * kC, dy.size()));
    EXPECT_TRUE(same_bits(dw.data(), ref_dw.data() + int64_t(n0) * kK, dw.size()));
    const std::vector<float> dx = d.dispatch_backward(dxg.data() + int64_t(row0) * kC);
    EXPECT_TRUE(same_bits(dx.data(), ref_dx.data() + int64_t(n0) * kC, dx.size()));

    // Inter-node payload of dispatch and combine against the independent counts; the Links
    // counters hold payload plus metadata exactly.
    const uint64_t row_bytes = kC * sizeof(float);
    const uint64_t want = mode == DispatchMode::Hierarchical ? expected.hierarchical
                          : mode == DispatchMode::FlatDedup  ? expected.flat_dedup
                                                             : expected.flat;
    EXPECT_EQ(dispatch_inter, want * row_bytes);
    EXPECT_EQ(combine_inter, remote_slots * row_bytes);
    LinkCounters all = test::world_total(links.counters());
    for (int link = 0; link < 2; ++link) {
      EXPECT_EQ(all.bytes[size_t(link)], world_sum(d.traffic().payload.bytes[size_t(link)]) +
                                             world_sum(d.traffic().metadata.bytes[size_t(link)]));
    }
    if (ranks_per_node == 1 || P == 1) {
      EXPECT_EQ(all.bytes[0], 0u);
    }
  }
  free_hierarchical(h);
}

TEST(ExpertDispatch, MatchesSingleRankReferenceOneRankPerNode) {
  check_against_reference(1);
}
TEST(ExpertDispatch, MatchesSingleRankReferenceTwoRanksPerNode) {
  check_against_reference(2);
}

// Everything one round of the four operations gives on a rank.
struct Round {
  std::vector<float> rows, out, dy, dw, dx;
  std::vector<int> offsets;
};

Round run_round(ExpertDispatcher& d, const Global& g, int n0, int N) {
  Round r;
  r.rows = d.dispatch(g.x.data() + int64_t(n0) * kC, g.idx.data() + int64_t(n0) * kK, N, kK, kC);
  r.offsets = d.local_expert_offsets();
  apply_experts(r.rows, r.offsets.data(), d.local_experts(), d.ep_rank() * d.local_experts());
  r.out = d.combine(r.rows.data(), g.w.data() + int64_t(n0) * kK);
  d.combine_backward(g.dout.data() + int64_t(n0) * kC, r.rows.data(), g.w.data() + int64_t(n0) * kK,
                     r.dy, r.dw);
  r.dx = d.dispatch_backward(r.rows.data());
  return r;
}

void expect_same_round(const Round& a, const Round& b) {
  EXPECT_EQ(a.offsets, b.offsets);
  for (const auto& [x, y] :
       {std::pair{&a.rows, &b.rows}, std::pair{&a.out, &b.out}, std::pair{&a.dy, &b.dy},
        std::pair{&a.dw, &b.dw}, std::pair{&a.dx, &b.dx}}) {
    ASSERT_EQ(x->size(), y->size());
    EXPECT_TRUE(same_bits(x->data(), y->data(), x->size()));
  }
}

// A dispatcher keeps its plans' and messages' buffers from one operation to the next: a round on
// fewer tokens after a round on more gives the bits a fresh dispatcher gives.
TEST(ExpertDispatch, AReusedDispatcherGivesAFreshOnesBits) {
  const int P = world_size(), rank = world_rank();
  for (int ranks_per_node : {1, 2}) {
    if (P % ranks_per_node != 0) continue;
    Links links(test::virtual_node_list(P, ranks_per_node), {});
    HierarchicalComm h = make_hierarchical(MPI_COMM_WORLD, links);
    const Global g = make_global(P, 4 * P);
    const int n0 = g.first_token[size_t(rank)], N = tokens_of(rank);
    for (DispatchMode mode :
         {DispatchMode::Flat, DispatchMode::FlatDedup, DispatchMode::Hierarchical}) {
      SCOPED_TRACE(std::string(dispatch_mode_name(mode)) + ", ranks per node " +
                   std::to_string(ranks_per_node));
      ExpertDispatcher used(h, links, g.E, mode), fresh(h, links, g.E, mode);
      run_round(used, g, n0, N);
      expect_same_round(run_round(used, g, n0 + N / 2, N - N / 2),
                        run_round(fresh, g, n0 + N / 2, N - N / 2));
    }
    free_hierarchical(h);
  }
}

TEST(ExpertDispatch, HierarchicalCutsInterNodeRowsOnUniformRouting) {
  // At 2 ranks per node the hierarchical count is never above the de-duplicated flat one.
  const int P = world_size();
  if (P % 2 != 0) GTEST_SKIP() << "needs an even world";
  const Global g = make_global(P, 4 * P);
  const Expected x = count_inter_node_rows(g, P, 2);
  EXPECT_LE(x.hierarchical, x.flat_dedup);
  EXPECT_LE(x.flat_dedup, x.flat);
}

TEST(ExpertDispatch, BadExpertParallelDegreeFailsOnEveryRank) {
  const int P = world_size();
  test::expect_config_error_everywhere([&] { validate_expert_parallel(8, P + 1, P); }, "--ep");
  test::expect_config_error_everywhere([&] { validate_expert_parallel(8, 0, P); }, "--ep");
  if (P >= 2) {
    Links links(test::virtual_node_list(P, 1), {});
    HierarchicalComm h = make_hierarchical(MPI_COMM_WORLD, links);
    test::expect_config_error_everywhere(
        [&] { ExpertDispatcher d(h, links, 2 * P + 1, DispatchMode::Flat); }, "--experts");
    free_hierarchical(h);
  }
  if (P == 6) {
    // Virtual nodes of 4 ranks over 6: nodes of 4 and 2 ranks.
    Links links(test::virtual_node_list(P, 4), {});
    HierarchicalComm h = make_hierarchical(MPI_COMM_WORLD, links);
    test::expect_config_error_everywhere(
        [&] { ExpertDispatcher d(h, links, 12, DispatchMode::Hierarchical); }, "--ranks-per-node");
    free_hierarchical(h);
  }
}

}  // namespace
}  // namespace rlf
