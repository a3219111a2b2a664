// Links: emulated delays, option validation, link classes, exact counters, and a lower bound on
// the time an emulated inter-node message takes.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "mpi_comm/links.h"
#include "tests/mpi/mpi_test_util.h"

namespace rlf {
namespace {

using test::world_rank;
using test::world_size;

TEST(LinkEmulation, DelayIsLatencyPlusBytesOverBandwidth) {
  EXPECT_FALSE((LinkEmulation{0, 0}.enabled()));
  EXPECT_EQ((LinkEmulation{0, 0}.delay_seconds(1 << 20)), 0.0);
  EXPECT_EQ((LinkEmulation{0, 0.02}.delay_seconds(12345)), 0.02);
  EXPECT_EQ((LinkEmulation{1e6, 0}.delay_seconds(500000)), 0.5);
  EXPECT_EQ((LinkEmulation{2e6, 0.001}.delay_seconds(1000000)), 0.001 + 0.5);
  EXPECT_EQ((LinkEmulation{2e6, 0.001}.delay_seconds(0)), 0.001);
}

TEST(LinkEmulation, ValidateNamesTheOption) {
  auto expect_error = [](LinkEmulation emulation, const std::string& option) {
    try {
      emulation.validate();
      ADD_FAILURE() << "no ConfigError for " << option;
    } catch (const ConfigError& error) {
      EXPECT_NE(std::string(error.what()).find(option), std::string::npos) << error.what();
    }
  };
  double inf = std::numeric_limits<double>::infinity();
  double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_NO_THROW((LinkEmulation{0, 0}.validate()));
  EXPECT_NO_THROW((LinkEmulation{1e9, 10}.validate()));
  expect_error({-1, 0}, "--inter-node-bandwidth");
  expect_error({inf, 0}, "--inter-node-bandwidth");
  expect_error({nan, 0}, "--inter-node-bandwidth");
  expect_error({0, -0.001}, "--inter-node-latency");
  expect_error({0, 10.5}, "--inter-node-latency");
  expect_error({0, nan}, "--inter-node-latency");
}

TEST(Links, ClassifiesByNode) {
  Links links({0, 0, 1, 1}, {});
  EXPECT_EQ(links.classify(0, 1), LinkClass::IntraNode);
  EXPECT_EQ(links.classify(2, 3), LinkClass::IntraNode);
  EXPECT_EQ(links.classify(1, 2), LinkClass::InterNode);
  EXPECT_EQ(links.classify(3, 0), LinkClass::InterNode);
  EXPECT_STREQ(link_class_name(LinkClass::IntraNode), "intra-node");
  EXPECT_STREQ(link_class_name(LinkClass::InterNode), "inter-node");
}

// Virtual nodes of 2 ranks: each rank sends (rank + 1) * 10 bytes to the next rank in a ring, and
// rank 0 also sends 100 bytes to rank 1 (same node). Only senders count.
TEST(Links, CountersAreExactAndPerSender) {
  int rank = world_rank(), size = world_size();
  Links links(test::virtual_node_list(size, 2), {});
  int next = (rank + 1) % size, previous = (rank - 1 + size) % size;
  std::vector<uint8_t> out(size_t(rank + 1) * 10, uint8_t(rank)), in(size_t(previous + 1) * 10);
  links.sendrecv(out.data(), out.size(), next, in.data(), in.size(), previous, 1, MPI_COMM_WORLD);
  EXPECT_EQ(in, std::vector<uint8_t>(in.size(), uint8_t(previous)));

  LinkCounters expected;
  expected.add(links.classify(rank, next), out.size());
  if (size >= 2 && rank <= 1) {
    std::vector<uint8_t> message(100, 7);
    if (rank == 0) {
      links.send(message.data(), message.size(), 1, 2, MPI_COMM_WORLD);
      expected.add(LinkClass::IntraNode, 100);
    } else {
      std::vector<uint8_t> larger_buffer(200);
      EXPECT_EQ(links.recv(larger_buffer.data(), larger_buffer.size(), 0, 2, MPI_COMM_WORLD), 100u);
    }
  }
  EXPECT_EQ(links.counters().bytes, expected.bytes);
  EXPECT_EQ(links.counters().messages, expected.messages);

  LinkCounters total = test::world_total(links.counters());
  uint64_t ring_bytes = uint64_t(size) * uint64_t(size + 1) / 2 * 10;
  uint64_t inter_ring_messages = size >= 3 ? uint64_t((size + 1) / 2) : 0;  // edges between nodes
  EXPECT_EQ(total.messages[0] + total.messages[1], uint64_t(size) + (size >= 2 ? 1 : 0));
  EXPECT_EQ(total.messages[1], inter_ring_messages);
  EXPECT_EQ(total.bytes[0] + total.bytes[1], ring_bytes + (size >= 2 ? 100 : 0));

  links.reset_counters();
  EXPECT_EQ(links.counters().bytes, (std::array<uint64_t, 2>{}));
}

// Sends count under the innermost TrafficScope's kind (Other outside any); the kinds add up to
// the link counters; a scope's end brings the kind before it back; reset clears the kinds too.
TEST(Links, CountsEachSendUnderItsTrafficKind) {
  Links links(test::virtual_node_list(world_size(), 1), {});
  const int peer = world_size() > 1 ? 1 - std::min(world_rank(), 1) : 0;
  links.count_send(peer, 5);
  {
    const TrafficScope gradients(links, TrafficKind::GradientReduce);
    links.count_send(peer, 100);
    {
      const TrafficScope dispatch(links, TrafficKind::ExpertDispatch);
      EXPECT_EQ(links.traffic_kind(), TrafficKind::ExpertDispatch);
      links.count_send(peer, 20);
    }
    EXPECT_EQ(links.traffic_kind(), TrafficKind::GradientReduce);
    links.count_send(peer, 3);
  }
  EXPECT_EQ(links.traffic_kind(), TrafficKind::Other);
  const LinkClass link = links.classify(world_rank(), peer);
  EXPECT_EQ(links.counters(TrafficKind::Other).bytes[size_t(link)], 5u);
  EXPECT_EQ(links.counters(TrafficKind::GradientReduce).bytes[size_t(link)], 103u);
  EXPECT_EQ(links.counters(TrafficKind::GradientReduce).messages[size_t(link)], 2u);
  EXPECT_EQ(links.counters(TrafficKind::ExpertDispatch).bytes[size_t(link)], 20u);
  LinkCounters sum;
  for (const TrafficKind kind : all_traffic_kinds()) sum += links.counters(kind);
  EXPECT_EQ(sum.bytes, links.counters().bytes);
  EXPECT_EQ(sum.messages, links.counters().messages);
  EXPECT_STREQ(traffic_kind_name(TrafficKind::PipelineActivations), "pipeline_activations");
  links.reset_counters();
  EXPECT_EQ(links.counters(TrafficKind::GradientReduce).bytes, (std::array<uint64_t, 2>{}));
}

TEST(Links, MessagesBeyondIntCountsAreRefused) {
  Links links(test::virtual_node_list(world_size(), 1), {});
  EXPECT_THROW(links.send(nullptr, uint64_t(INT_MAX) + 1, 0, 3, MPI_COMM_WORLD), std::length_error);
  EXPECT_EQ(links.counters().messages, (std::array<uint64_t, 2>{}));
}

// Sleeping gives a reliable lower bound (never an upper one on a shared machine).
TEST(Links, EmulatedInterNodeMessageTakesAtLeastItsDelay) {
  if (world_size() < 2) GTEST_SKIP() << "needs two ranks";
  LinkEmulation emulation{1e6, 0.02};
  Links links(test::virtual_node_list(world_size(), 1), emulation);
  std::vector<uint8_t> message(1000, 1);
  if (world_rank() == 0) {
    links.send(message.data(), message.size(), 1, 4, MPI_COMM_WORLD);
  } else if (world_rank() == 1) {
    auto start = std::chrono::steady_clock::now();
    links.recv(message.data(), message.size(), 0, 4, MPI_COMM_WORLD);
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_GE(seconds, emulation.delay_seconds(1000));  // 0.021 s
  }
}

}  // namespace
}  // namespace rlf
