// Hierarchical and flat collectives on virtual nodes: results against a serial reference and
// against each other, exact byte counts from the byte model, every broadcast root, bucketing,
// gather/scatter round trips, and the ring allgather of uneven (and empty) blocks.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "mpi_comm/hierarchical_collectives.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/test_util.h"

namespace rlf {
namespace {

using test::world_rank;
using test::world_size;

// The world split into virtual nodes of `ranks_per_node` consecutive ranks.
struct VirtualNodeWorld {
  explicit VirtualNodeWorld(int ranks_per_node)
      : links(test::virtual_node_list(world_size(), ranks_per_node), {}),
        h(make_hierarchical(MPI_COMM_WORLD, links)) {}
  ~VirtualNodeWorld() { free_hierarchical(h); }
  Links links;
  HierarchicalComm h;
};

// Node sizes that divide the world: 1 rank per node, 2 and 3 where they fit, and one node.
std::vector<int> node_sizes() {
  std::vector<int> sizes;
  for (int ranks_per_node : {1, 2, 3, world_size()}) {
    bool fits = world_size() % ranks_per_node == 0;
    if (fits && std::find(sizes.begin(), sizes.end(), ranks_per_node) == sizes.end()) {
      sizes.push_back(ranks_per_node);
    }
  }
  return sizes;
}

std::vector<float> rank_data(int rank, int64_t count, const std::string& name) {
  return test::random_vector<float>(size_t(count), test::seed_for(name, rank));
}

// Every rank holds the bits rank 0 holds.
bool identical_on_every_rank(const std::vector<float>& values) {
  std::vector<float> first = values;
  MPI_Bcast(first.data(), int(first.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  return test::on_every_rank(std::memcmp(first.data(), values.data(), values.size() * 4) == 0);
}

TEST(HierarchicalComm, StructureOfVirtualNodes) {
  for (int ranks_per_node : node_sizes()) {
    VirtualNodeWorld world(ranks_per_node);
    const HierarchicalComm& h = world.h;
    ASSERT_EQ(h.size(), world_size());
    EXPECT_EQ(h.rank(), world_rank());
    EXPECT_EQ(h.node_count(), world_size() / ranks_per_node);
    for (int r = 0; r < world_size(); ++r) {
      EXPECT_EQ(h.world_ranks[size_t(r)], r);
      EXPECT_EQ(h.local_rank_of[size_t(r)], r % ranks_per_node);
      EXPECT_EQ(h.leader_index_of[size_t(r)], r / ranks_per_node);
    }
    int intra_rank = -1;
    MPI_Comm_rank(h.intra, &intra_rank);
    EXPECT_EQ(intra_rank, world_rank() % ranks_per_node);
    EXPECT_EQ(h.leaders != MPI_COMM_NULL, world_rank() % ranks_per_node == 0);
  }
}

// Counts chosen to cover uneven chunks (1001), fewer floats than ranks (3) and many buckets (a
// 256-byte bucket is 64 floats).
TEST(Allreduce, HierarchicalEqualsFlatAndTheSerialSum) {
  int size = world_size();
  for (int ranks_per_node : node_sizes()) {
    for (auto [count, bucket_bytes] : {std::pair<int64_t, uint64_t>{1001, kDefaultBucketBytes},
                                       {3, kDefaultBucketBytes},
                                       {1001, 256}}) {
      SCOPED_TRACE("ranks per node " + std::to_string(ranks_per_node) + ", count " +
                   std::to_string(count) + ", bucket " + std::to_string(bucket_bytes));
      std::vector<double> serial(size_t(count), 0.0);
      for (int r = 0; r < size; ++r) {
        auto data = rank_data(r, count, "allreduce");
        for (int64_t i = 0; i < count; ++i) serial[size_t(i)] += data[size_t(i)];
      }
      VirtualNodeWorld world(ranks_per_node);
      auto hierarchical = rank_data(world_rank(), count, "allreduce");
      auto flat = hierarchical;
      allreduce_sum(hierarchical.data(), count, world.h, world.links, bucket_bytes);
      flat_allreduce_sum(flat.data(), count, world.h, world.links, bucket_bytes);
      for (int64_t i = 0; i < count; ++i) {
        EXPECT_NEAR(hierarchical[size_t(i)], serial[size_t(i)], 1e-5) << i;
        EXPECT_NEAR(flat[size_t(i)], hierarchical[size_t(i)], 1e-5) << i;
      }
      EXPECT_TRUE(identical_on_every_rank(hierarchical));
      EXPECT_TRUE(identical_on_every_rank(flat));
    }
  }
}

// Integer-valued floats sum exactly in any order, so both algorithms match the serial sum bit for
// bit.
TEST(Allreduce, IntegerValuedDataIsExact) {
  int size = world_size();
  const int64_t count = 777;
  auto integers = [](int rank, int64_t i) { return float((rank * 7 + i) % 13 - 6); };
  std::vector<float> serial(size_t(count), 0.0f);
  for (int r = 0; r < size; ++r) {
    for (int64_t i = 0; i < count; ++i) serial[size_t(i)] += integers(r, i);
  }
  for (int ranks_per_node : node_sizes()) {
    VirtualNodeWorld world(ranks_per_node);
    std::vector<float> hierarchical(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) hierarchical[size_t(i)] = integers(world_rank(), i);
    auto flat = hierarchical;
    allreduce_sum(hierarchical.data(), count, world.h, world.links);
    flat_allreduce_sum(flat.data(), count, world.h, world.links);
    EXPECT_EQ(hierarchical, serial);
    EXPECT_EQ(flat, serial);
  }
}

// The byte model of hierarchical_collectives.h with c = 6000 floats (b = 24000 bytes, one bucket;
// 6000 is divisible by every rank and node count here), P ranks, N = P / R nodes:
//   flat ring:    total 2 b (P - 1), inter 2 b (P - 1) / R (N ring edges cross nodes, N >= 2)
//   hierarchical: intra 2 b (P - N) in 2 P (R - 1) messages, inter 2 b (N - 1) in 2 P (N - 1)
// e.g. 4 ranks, R = 2: flat inter 72000 vs hierarchical 48000; 6 ranks, R = 2: 120000 vs 96000;
// 6 ranks, R = 3: 80000 vs 48000.
TEST(Allreduce, ByteCountsFollowTheModel) {
  const int64_t count = 6000;
  const uint64_t b = count * sizeof(float);
  const uint64_t P = uint64_t(world_size());
  for (int ranks_per_node : node_sizes()) {
    SCOPED_TRACE("ranks per node " + std::to_string(ranks_per_node));
    const uint64_t N = P / uint64_t(ranks_per_node);
    VirtualNodeWorld world(ranks_per_node);
    auto data = rank_data(world_rank(), count, "bytes");

    flat_allreduce_sum(data.data(), count, world.h, world.links);
    LinkCounters flat = test::world_total(world.links.counters());
    uint64_t flat_inter = N >= 2 ? 2 * b * (P - 1) / uint64_t(ranks_per_node) : 0;
    EXPECT_EQ(flat.bytes[1], flat_inter);
    EXPECT_EQ(flat.bytes[0], 2 * b * (P - 1) - flat_inter);
    EXPECT_EQ(flat.messages[1], N >= 2 ? N * 2 * (P - 1) : 0);
    EXPECT_EQ(flat.messages[0], (N >= 2 ? P - N : P) * 2 * (P - 1));

    world.links.reset_counters();
    allreduce_sum(data.data(), count, world.h, world.links);
    LinkCounters hierarchical = test::world_total(world.links.counters());
    EXPECT_EQ(hierarchical.bytes[0], 2 * b * (P - N));
    EXPECT_EQ(hierarchical.bytes[1], 2 * b * (N - 1));
    EXPECT_EQ(hierarchical.messages[0], 2 * P * (uint64_t(ranks_per_node) - 1));
    EXPECT_EQ(hierarchical.messages[1], 2 * P * (N - 1));
    // Every rank's links carry its share: 2 b (R - 1) / R inside the node.
    EXPECT_EQ(world.links.counters().bytes[0],
              2 * b * (uint64_t(ranks_per_node) - 1) / uint64_t(ranks_per_node));
    if (ranks_per_node >= 2 && N >= 2) {
      EXPECT_LT(hierarchical.bytes[1], flat.bytes[1]);
    }
  }
}

// Inside one node every element is summed in the binomial tree's order (rank 0 adds rank 1, then
// ranks 2 and 3 summed likewise, ...), wherever it lies in the buffer: the bits of the serial
// tree sum, for uneven shares (1001 floats), fewer floats than ranks (3) and several buckets.
TEST(Allreduce, OneNodeSumsEveryElementInTheTreeOrder) {
  const int size = world_size();
  for (auto [count, bucket_bytes] : {std::pair<int64_t, uint64_t>{1001, kDefaultBucketBytes},
                                     {3, kDefaultBucketBytes},
                                     {1001, 256}}) {
    SCOPED_TRACE("count " + std::to_string(count) + ", bucket " + std::to_string(bucket_bytes));
    std::vector<std::vector<float>> partial;
    for (int r = 0; r < size; ++r) partial.push_back(rank_data(r, count, "tree order"));
    for (int mask = 1; mask < size; mask <<= 1) {
      for (int r = 0; r + mask < size; r += 2 * mask) {
        for (int64_t i = 0; i < count; ++i)
          partial[size_t(r)][size_t(i)] += partial[size_t(r + mask)][size_t(i)];
      }
    }
    VirtualNodeWorld world(size);
    auto data = rank_data(world_rank(), count, "tree order");
    allreduce_sum(data.data(), count, world.h, world.links, bucket_bytes);
    EXPECT_EQ(std::memcmp(data.data(), partial[0].data(), size_t(count) * sizeof(float)), 0);
  }
}

// A group spanning nodes unevenly (the first 3 ranks of nodes of 2: nodes of 2 and 1) goes through
// the node leaders: the serial sum on every rank, intra 2 b (P - N) bytes in 2 (P - N) messages,
// inter 2 b (N - 1) in 2 N (N - 1).
TEST(Allreduce, UnevenNodesGoThroughTheLeaders) {
  if (world_size() < 3) GTEST_SKIP() << "needs 3 ranks";
  Links links(test::virtual_node_list(world_size(), 2), {});
  MPI_Comm three = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() < 3 ? 0 : MPI_UNDEFINED, world_rank(), &three);
  if (three != MPI_COMM_NULL) {
    HierarchicalComm h = make_hierarchical(three, links);
    EXPECT_EQ(h.peers, MPI_COMM_NULL);
    const int64_t count = 1001;
    const uint64_t b = count * sizeof(float);
    std::vector<double> serial(size_t(count), 0.0);
    for (int r = 0; r < 3; ++r) {
      const auto d = rank_data(r, count, "uneven");
      for (int64_t i = 0; i < count; ++i) serial[size_t(i)] += d[size_t(i)];
    }
    auto data = rank_data(world_rank(), count, "uneven");
    allreduce_sum(data.data(), count, h, links);
    for (int64_t i = 0; i < count; ++i) EXPECT_NEAR(data[size_t(i)], serial[size_t(i)], 1e-5) << i;
    LinkCounters total = links.counters();
    MPI_Allreduce(MPI_IN_PLACE, total.bytes.data(), 2, MPI_UINT64_T, MPI_SUM, three);
    MPI_Allreduce(MPI_IN_PLACE, total.messages.data(), 2, MPI_UINT64_T, MPI_SUM, three);
    EXPECT_EQ(total.bytes[0], 2 * b);
    EXPECT_EQ(total.bytes[1], 2 * b);
    EXPECT_EQ(total.messages[0], 2u);
    EXPECT_EQ(total.messages[1], 4u);
    free_hierarchical(h);
    MPI_Comm_free(&three);
  }
}

// Every root, both algorithms, one bucket and 11 buckets of 1000 bytes: every rank ends with the
// root's bytes; P - 1 messages per bucket, N - 1 of them inter-node for the hierarchical one.
TEST(Broadcast, EveryRootDeliversIdenticalBytes) {
  const uint64_t bytes = 10007;
  const uint64_t P = uint64_t(world_size());
  for (int ranks_per_node : node_sizes()) {
    const uint64_t N = P / uint64_t(ranks_per_node);
    VirtualNodeWorld world(ranks_per_node);
    for (int root = 0; root < world_size(); ++root) {
      std::vector<uint8_t> expected(bytes);
      std::mt19937 generator(uint32_t(root * 31 + ranks_per_node));
      for (auto& byte : expected) byte = uint8_t(generator());
      for (bool hierarchical : {true, false}) {
        for (uint64_t bucket : {kDefaultBucketBytes, uint64_t(1000)}) {
          SCOPED_TRACE("ranks per node " + std::to_string(ranks_per_node) + ", root " +
                       std::to_string(root) + (hierarchical ? ", hierarchical" : ", flat") +
                       ", bucket " + std::to_string(bucket));
          std::vector<uint8_t> buffer =
              world_rank() == root ? expected : std::vector<uint8_t>(bytes, 0xAA);
          world.links.reset_counters();
          if (hierarchical) {
            broadcast(buffer.data(), bytes, root, world.h, world.links, bucket);
          } else {
            flat_broadcast(buffer.data(), bytes, root, world.h, world.links, bucket);
          }
          EXPECT_TRUE(test::on_every_rank(buffer == expected));
          LinkCounters total = test::world_total(world.links.counters());
          uint64_t buckets = (bytes + bucket - 1) / bucket;
          EXPECT_EQ(total.bytes[0] + total.bytes[1], (P - 1) * bytes);
          EXPECT_EQ(total.messages[0] + total.messages[1], (P - 1) * buckets);
          if (hierarchical) {
            EXPECT_EQ(total.bytes[1], (N - 1) * bytes);
          }
        }
      }
    }
  }
}

TEST(Broadcast, NothingToSendSendsNothing) {
  VirtualNodeWorld world(1);
  broadcast(nullptr, 0, 0, world.h, world.links);
  flat_broadcast(nullptr, 0, 0, world.h, world.links);
  EXPECT_EQ(world.links.counters().messages, (std::array<uint64_t, 2>{}));
}

std::vector<uint8_t> member_bytes(int world_rank) {
  std::vector<uint8_t> bytes(size_t(world_rank * 5 % 7));  // world rank 0 sends an empty buffer
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t(world_rank * 16 + int(i));
  return bytes;
}

// Gather to the node leader, reverse every buffer there, scatter back: each rank gets its own
// bytes reversed. Per non-leader member: a size message and a payload message when non-empty,
// both ways, all intra-node.
TEST(GatherScatter, RoundTripThroughTheNodeLeader) {
  for (int ranks_per_node : node_sizes()) {
    SCOPED_TRACE("ranks per node " + std::to_string(ranks_per_node));
    VirtualNodeWorld world(ranks_per_node);
    int leader = world_rank() - world_rank() % ranks_per_node;
    auto gathered = gather_bytes(member_bytes(world_rank()), world.h, world.links);
    if (world_rank() == leader) {
      ASSERT_EQ(gathered.size(), size_t(ranks_per_node));
      for (int i = 0; i < ranks_per_node; ++i) {
        EXPECT_EQ(gathered[size_t(i)], member_bytes(leader + i));
        std::reverse(gathered[size_t(i)].begin(), gathered[size_t(i)].end());
      }
    } else {
      EXPECT_TRUE(gathered.empty());
    }
    auto mine = scatter_bytes(gathered, world.h, world.links);
    auto expected = member_bytes(world_rank());
    std::reverse(expected.begin(), expected.end());
    EXPECT_EQ(mine, expected);

    LinkCounters total = test::world_total(world.links.counters());
    uint64_t messages = 0, bytes = 0;
    for (int r = 0; r < world_size(); ++r) {
      if (r % ranks_per_node == 0) continue;
      uint64_t payload = member_bytes(r).size();
      messages += 2 * (1 + (payload > 0 ? 1 : 0));
      bytes += 2 * (sizeof(uint64_t) + payload);
    }
    EXPECT_EQ(total.bytes[0], bytes);
    EXPECT_EQ(total.messages[0], messages);
    EXPECT_EQ(total.bytes[1], 0u);
  }
}

// Blocks of 3 r bytes (rank 0's empty): every rank ends with every block, and rank r sends every
// block but block r + 1 in P - 1 messages (empty ones included), as the byte model says.
TEST(Allgather, UnevenBlocksReachEveryRankWithTheModelsBytes) {
  const int P = world_size();
  std::vector<uint64_t> offsets{0};
  for (int r = 0; r < P; ++r) offsets.push_back(offsets.back() + 3 * uint64_t(r));
  auto block_byte = [](int r, uint64_t i) { return uint8_t(17 * r + i + 1); };
  for (int ranks_per_node : node_sizes()) {
    SCOPED_TRACE("ranks per node " + std::to_string(ranks_per_node));
    VirtualNodeWorld world(ranks_per_node);
    std::vector<uint8_t> data(offsets.back(), 0);
    const int me = world_rank();
    for (uint64_t i = offsets[size_t(me)]; i < offsets[size_t(me) + 1]; ++i) {
      data[i] = block_byte(me, i - offsets[size_t(me)]);
    }
    flat_allgather(data.data(), offsets, world.h, world.links);
    for (int r = 0; r < P; ++r) {
      for (uint64_t i = offsets[size_t(r)]; i < offsets[size_t(r) + 1]; ++i) {
        ASSERT_EQ(data[i], block_byte(r, i - offsets[size_t(r)])) << "block " << r;
      }
    }
    const LinkCounters& mine = world.links.counters();
    const int next = (me + 1) % P;
    EXPECT_EQ(mine.bytes[0] + mine.bytes[1],
              offsets.back() - (offsets[size_t(next) + 1] - offsets[size_t(next)]));
    EXPECT_EQ(mine.messages[0] + mine.messages[1], uint64_t(P - 1));
  }
}

}  // namespace
}  // namespace rlf
