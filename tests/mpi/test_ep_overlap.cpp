// Chunked, overlapped expert parallelism (OverlappedExperts) and the split-phase dispatcher under
// it. On fresh random inputs, every rank compares its tokens' outputs and input gradients, its
// dexpert_weight and its local experts' weight gradients with (a) the plain path (chunks = 1:
// blocking dispatch, compute, blocking combine) and (b) one rank running the whole batch through
// the reference MoE kernels. With the reference FFN kernel (rows independent of each other) the
// outputs, dx and dexpert_weight are bit-exact against both; the weight gradients sum rows in
// another order (chunk by chunk) and match within float tolerance; with the Eigen kernel
// everything matches within float tolerance. Flat and hierarchical dispatch, a rank with zero
// tokens, more chunks than tokens. Split-phase: link emulation is a deadline that blocking calls
// honour and progress() alone can meet, chunking moves exactly the un-chunked payload bytes, and
// a chain waits for its deadlines by sleeping.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <chrono>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kernels/arena.h"
#include "kernels/moe.h"
#include "kernels/ops.h"
#include "mpi_comm/expert_dispatch.h"
#include "mpi_comm/split_phase.h"
#include "mpi_comm/topology.h"
#include "src/model/overlapped_experts.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/test_util.h"

namespace rlf {
namespace {

constexpr int kK = 2, kC = 8, kF = 6, kExpertsPerRank = 2;

// Rank 1 (when it exists) has no tokens; rank 0 has 5, fewer than the largest chunk count.
int tokens_of(int rank) {
  return rank == 1 ? 0 : 5 + 3 * rank;
}

// The batch of every rank (rank-major), drawn from one seed so every rank builds the same.
struct Batch {
  int E = 0, N = 0;
  std::vector<int> first_token, idx;
  std::vector<float> x, w, dout, w1, w3, w2;
};

Batch make_batch(int ranks, uint64_t seed) {
  Batch b;
  b.E = kExpertsPerRank * ranks;
  for (int r = 0; r < ranks; ++r) {
    b.first_token.push_back(b.N);
    b.N += tokens_of(r);
  }
  b.first_token.push_back(b.N);
  b.x = test::random_vector<float>(size_t(b.N) * kC, seed + 1);
  b.dout = test::random_vector<float>(size_t(b.N) * kC, seed + 2);
  b.w = test::random_vector<float>(size_t(b.N) * kK, seed + 3, 0.1, 1.0);
  b.w1 = test::random_vector<float>(size_t(b.E) * kF * kC, seed + 4, -0.5, 0.5);
  b.w3 = test::random_vector<float>(size_t(b.E) * kF * kC, seed + 5, -0.5, 0.5);
  b.w2 = test::random_vector<float>(size_t(b.E) * kC * kF, seed + 6, -0.5, 0.5);
  // kK distinct experts per token.
  const std::vector<int> draws = test::random_ints(size_t(b.N) * kK * 8, seed + 7, 0, b.E - 1);
  size_t next = 0;
  for (int n = 0; n < b.N; ++n) {
    std::set<int> used;
    while (int(used.size()) < kK) {
      const int e = draws[next++];
      if (used.insert(e).second) b.idx.push_back(e);
    }
  }
  return b;
}

// What one rank's tokens and experts get.
struct Result {
  std::vector<float> out, dx, dweight, dw1, dw3, dw2;
};

// One rank, the whole batch, the reference kernels; then this rank's share of the results.
Result single_rank_reference(const Batch& b, int rank) {
  const int N = b.N, E = b.E, M = N * kK;
  std::vector<int> offsets(size_t(E) + 1), row_of(static_cast<size_t>(M)),
      token_of(static_cast<size_t>(M));
  moe_build_routing(offsets.data(), row_of.data(), token_of.data(), b.idx.data(), N, E, kK);
  std::vector<float> xg(size_t(M) * kC), a(size_t(M) * kF), bb(size_t(M) * kF), y(size_t(M) * kC),
      out(size_t(N) * kC);
  ref::moe_gather(xg.data(), b.x.data(), token_of.data(), M, kC);
  const int64_t FC = kF * kC;
  const auto w1 = consecutive_experts(b.w1.data(), E, FC),
             w3 = consecutive_experts(b.w3.data(), E, FC),
             w2 = consecutive_experts(b.w2.data(), E, FC);
  ref::expert_ffn_forward(y.data(), a.data(), bb.data(), xg.data(), w1.data(), w3.data(), w2.data(),
                          offsets.data(), E, kC, kF);
  ref::moe_combine(out.data(), y.data(), b.w.data(), row_of.data(), N, kK, kC);
  std::vector<float> dy(size_t(M) * kC, 0), dweight(size_t(M), 0), dxg(size_t(M) * kC, 0),
      dx(size_t(N) * kC, 0), dw1(b.w1.size(), 0), dw3(b.w3.size(), 0), dw2(b.w2.size(), 0);
  ref::moe_combine_backward(dy.data(), dweight.data(), b.dout.data(), y.data(), b.w.data(),
                            row_of.data(), N, kK, kC);
  ref::expert_ffn_backward(dxg.data(), consecutive_experts(dw1.data(), E, FC).data(),
                           consecutive_experts(dw3.data(), E, FC).data(),
                           consecutive_experts(dw2.data(), E, FC).data(), dy.data(), xg.data(),
                           a.data(), bb.data(), w1.data(), w3.data(), w2.data(), offsets.data(), E,
                           kC, kF);
  ref::moe_gather_backward(dx.data(), dxg.data(), row_of.data(), N, kK, kC);
  const int64_t n0 = b.first_token[size_t(rank)], n1 = b.first_token[size_t(rank) + 1];
  const int64_t e0 = int64_t(rank) * kExpertsPerRank, e1 = e0 + kExpertsPerRank;
  Result r;
  r.out.assign(out.begin() + n0 * kC, out.begin() + n1 * kC);
  r.dx.assign(dx.begin() + n0 * kC, dx.begin() + n1 * kC);
  r.dweight.assign(dweight.begin() + n0 * kK, dweight.begin() + n1 * kK);
  r.dw1.assign(dw1.begin() + e0 * FC, dw1.begin() + e1 * FC);
  r.dw3.assign(dw3.begin() + e0 * FC, dw3.begin() + e1 * FC);
  r.dw2.assign(dw2.begin() + e0 * FC, dw2.begin() + e1 * FC);
  return r;
}

Result run_overlapped(const Batch& b, const HierarchicalComm& ep, Links& links, DispatchMode mode,
                      int chunks, const Ops<float>& ops) {
  const int rank = test::world_rank(), N = tokens_of(rank);
  const int64_t n0 = b.first_token[size_t(rank)], FC = kF * kC;
  const int64_t e0 = int64_t(rank) * kExpertsPerRank;
  Arena scratch("overlap test", 8 << 20);
  OverlappedExperts layer(ep, links, b.E, mode, chunks, kC, kF, ops, scratch);
  const auto w1 = consecutive_experts(b.w1.data() + e0 * FC, kExpertsPerRank, FC);
  const auto w3 = consecutive_experts(b.w3.data() + e0 * FC, kExpertsPerRank, FC);
  const auto w2 = consecutive_experts(b.w2.data() + e0 * FC, kExpertsPerRank, FC);
  const LocalExperts w{w1.data(), w3.data(), w2.data()};
  Result r;
  r.out.assign(size_t(N) * kC, -1.0f);
  r.dx.assign(size_t(N) * kC, 0.0f);
  r.dweight.assign(size_t(N) * kK, -1.0f);
  for (auto* g : {&r.dw1, &r.dw3, &r.dw2}) g->assign(size_t(kExpertsPerRank * FC), 0.0f);
  const auto g1 = consecutive_experts(r.dw1.data(), kExpertsPerRank, FC);
  const auto g3 = consecutive_experts(r.dw3.data(), kExpertsPerRank, FC);
  const auto g2 = consecutive_experts(r.dw2.data(), kExpertsPerRank, FC);
  layer.forward(w, b.x.data() + n0 * kC, b.idx.data() + n0 * kK, b.w.data() + n0 * kK, N, kK,
                r.out.data());
  layer.backward(w, {g1.data(), g3.data(), g2.data()}, b.dout.data() + n0 * kC, r.dx.data(),
                 r.dweight.data());
  return r;
}

void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  EXPECT_TRUE(got.empty() || std::memcmp(got.data(), want.data(), got.size() * 4) == 0)
      << what << " differs in bits (nmse " << test::nmse(got.data(), want.data(), got.size())
      << ")";
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  test::expect_close(got.data(), want.data(), got.size(), what, 1e-5, 1e-4);
}

void check_results(const Result& got, const Result& want, bool exact, const std::string& what) {
  if (exact) {
    expect_same_bits(got.out, want.out, what + " out");
    expect_same_bits(got.dx, want.dx, what + " dx");
    expect_same_bits(got.dweight, want.dweight, what + " dexpert_weight");
  } else {
    expect_close(got.out, want.out, what + " out");
    expect_close(got.dx, want.dx, what + " dx");
    expect_close(got.dweight, want.dweight, what + " dexpert_weight");
  }
  expect_close(got.dw1, want.dw1, what + " dw1");
  expect_close(got.dw3, want.dw3, what + " dw3");
  expect_close(got.dw2, want.dw2, what + " dw2");
}

struct Layout {
  DispatchMode mode;
  int ranks_per_node;
};

std::vector<Layout> layouts() {
  std::vector<Layout> all = {{DispatchMode::Flat, 1}, {DispatchMode::FlatDedup, 1}};
  const int P = test::world_size();
  all.push_back({DispatchMode::Hierarchical, P % 2 == 0 ? 2 : 1});
  return all;
}

void check_against_plain_and_reference(const Ops<float>& ops, bool exact, int seed_index) {
  const int P = test::world_size(), rank = test::world_rank();
  const Batch b = make_batch(P, test::seed_for("EpOverlap", seed_index));
  const Result reference = single_rank_reference(b, rank);
  for (const Layout& layout : layouts()) {
    const std::string where = std::string(dispatch_mode_name(layout.mode)) +
                              " ranks_per_node=" + std::to_string(layout.ranks_per_node);
    SCOPED_TRACE(where);
    Links links(test::virtual_node_list(P, layout.ranks_per_node), {});
    HierarchicalComm ep = make_hierarchical(MPI_COMM_WORLD, links);
    const Result plain = run_overlapped(b, ep, links, layout.mode, 1, ops);
    check_results(plain, reference, exact, "plain vs single rank");
    // 8 chunks: more than rank 0's 5 tokens, so some chunks are empty on some ranks.
    for (int chunks : {2, 3, 8}) {
      SCOPED_TRACE("chunks=" + std::to_string(chunks));
      const Result overlapped = run_overlapped(b, ep, links, layout.mode, chunks, ops);
      check_results(overlapped, plain, exact, "overlapped vs plain");
      check_results(overlapped, reference, exact, "overlapped vs single rank");
    }
    free_hierarchical(ep);
  }
}

TEST(ExpertParallelOverlap, ReferenceKernelBitExactWithPlainAndSingleRank) {
  check_against_plain_and_reference(reference_ops<float>(), true, 0);
}

TEST(ExpertParallelOverlap, CpuKernelMatchesPlainAndSingleRank) {
  check_against_plain_and_reference(cpu_ops(), false, 1);
}

TEST(ExpertParallelOverlap, BadChunkCountFailsOnEveryRank) {
  const int P = test::world_size();
  Links links(test::virtual_node_list(P, 1), {});
  HierarchicalComm ep = make_hierarchical(MPI_COMM_WORLD, links);
  Arena scratch("overlap test", 1 << 20);
  test::expect_config_error_everywhere(
      [&] {
        OverlappedExperts layer(ep, links, 2 * P, DispatchMode::Flat, 0, kC, kF, cpu_ops(),
                                scratch);
      },
      "--chunks");
  free_hierarchical(ep);
}

TEST(ExpertParallelOverlap, ChunksMoveExactlyThePlainPayloadBytes) {
  const int P = test::world_size(), rank = test::world_rank(), N = tokens_of(rank);
  const Batch b = make_batch(P, test::seed_for("EpOverlapBytes", 0));
  const int64_t n0 = b.first_token[size_t(rank)];
  for (const Layout& layout : layouts()) {
    SCOPED_TRACE(dispatch_mode_name(layout.mode));
    Links links(test::virtual_node_list(P, layout.ranks_per_node), {});
    HierarchicalComm ep = make_hierarchical(MPI_COMM_WORLD, links);
    Arena scratch("overlap test", 1 << 20);
    std::vector<LinkCounters> payload;
    for (int chunks : {1, 3}) {
      OverlappedExperts layer(ep, links, b.E, layout.mode, chunks, kC, kF, cpu_ops(), scratch);
      layer.communicate_only(b.x.data() + n0 * kC, b.idx.data() + n0 * kK, b.w.data() + n0 * kK, N,
                             kK, b.dout.data() + n0 * kC);
      LinkCounters sum;
      for (int c = 0; c < chunks; ++c) sum += layer.dispatcher(c).traffic().payload;
      payload.push_back(test::world_total(sum));
    }
    EXPECT_EQ(payload[0].bytes, payload[1].bytes);
    if (P > 1 && layout.ranks_per_node == 1) {
      EXPECT_GT(payload[0].bytes[1], 0u);
    }
    free_hierarchical(ep);
  }
}

// Emulation as a deadline: a blocking dispatch takes at least the emulated link time of what it
// received (messages into a rank pass one port one after another), and a split-phase dispatch
// completes through progress() calls alone while the caller "computes" (sleeps), so
// finish_dispatch then has nothing left to wait for; a finish that does not match the operation
// begun is a logic error.
TEST(ExpertParallelOverlap, EmulationDeadlinesAreHonouredAndCanBeMetByProgress) {
  const int P = test::world_size(), rank = test::world_rank(), N = tokens_of(rank);
  if (P < 2) GTEST_SKIP() << "needs an inter-node link";
  const Batch b = make_batch(P, test::seed_for("EpOverlapDeadline", 0));
  const int64_t n0 = b.first_token[size_t(rank)];
  LinkEmulation emulation{0, 0.01};  // 10 ms per inter-node message
  Links links(test::virtual_node_list(P, 1), emulation);
  HierarchicalComm ep = make_hierarchical(MPI_COMM_WORLD, links);
  using Clock = std::chrono::steady_clock;
  {
    ExpertDispatcher d(ep, links, b.E, DispatchMode::Flat);
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = Clock::now();
    d.dispatch(b.x.data() + n0 * kC, b.idx.data() + n0 * kK, N, kK, kC);
    const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
    // Every rank gets a count message from every other rank.
    EXPECT_GE(d.traffic().emulated_seconds, (P - 1) * 0.01 - 1e-9);
    EXPECT_GE(elapsed, d.traffic().emulated_seconds - 1e-6);
  }
  {
    ExpertDispatcher d(ep, links, b.E, DispatchMode::Flat);
    MPI_Barrier(MPI_COMM_WORLD);
    d.begin_dispatch(b.x.data() + n0 * kC, b.idx.data() + n0 * kK, N, kK, kC);
    const auto give_up = Clock::now() + std::chrono::seconds(30);
    bool done = false;
    while (!done && Clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // "compute"
      done = d.progress();
    }
    EXPECT_TRUE(done) << "progress() alone did not complete the dispatch";
    EXPECT_TRUE(d.chain().finished());  // finish_dispatch has nothing left to wait for
    const std::vector<float> rows = d.finish_dispatch();
    EXPECT_EQ(rows.size(), size_t(d.local_rows()) * kC);
    EXPECT_THROW(d.finish_combine(), std::logic_error);
  }
  free_hierarchical(ep);
}

double thread_cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_THREAD, &usage);
  return double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         1e-6 * double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

// A chain's next step runs only once the previous step's deadline has passed, and waiting for it
// sleeps instead of spinning (the thread's CPU time stays far below the wall time).
TEST(SplitPhaseChain, StepsWaitForTheirDeadlineAndWaitingSleeps) {
  SplitPhaseChain chain;
  double deadline = 0, second_ran = 0;
  bool third_ran = false;
  chain.start({[&] {
                 deadline = steady_seconds() + 0.2;
                 chain.complete_no_earlier_than(deadline);
               },
               [&] { second_ran = steady_seconds(); }, [&] { third_ran = true; }});
  EXPECT_FALSE(chain.progress());
  EXPECT_FALSE(third_ran);
  EXPECT_GT(chain.ready_in(1.0), 0.0);
  const double cpu0 = thread_cpu_seconds(), wall0 = steady_seconds();
  progress_until_finished(chain, {&chain});
  const double cpu = thread_cpu_seconds() - cpu0, wall = steady_seconds() - wall0;
  EXPECT_TRUE(chain.finished());
  EXPECT_TRUE(third_ran);
  EXPECT_GE(second_ran, deadline);
  EXPECT_LT(cpu, 0.25 * wall) << "waiting used " << cpu << " s of CPU in " << wall << " s";
  EXPECT_THROW(
      {
        chain.start({[&] { chain.complete_no_earlier_than(steady_seconds() + 10); }});
        chain.start({});
      },
      std::logic_error);
}

}  // namespace
}  // namespace rlf
