// DistQueue over MPI: actors put seeded samples with random delays while learners get them
// concurrently; every sample arrives exactly once with identical contents, in canonical order,
// under back-pressure and version policies too; server-side counters equal the byte formulas;
// hierarchical gets cost the queue 1/group-size of the requests of flat ones, and a
// tensor-parallel group's leader get costs it exactly 1/TP of the requests and bytes of every
// TP rank fetching its own copy. Gets by sample-id
// range return exactly their ids whatever the timing (the deterministic split of a step's batch).
// Layouts cover learner-hosted shards and dedicated queue ranks at every world size that can
// express them.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "mpi_comm/topology.h"
#include "src/model/tensor_parallel.h"
#include "src/roles/dist_queue.h"
#include "src/roles/queue_protocol.h"
#include "src/roles/sample_packing.h"
#include "src/runtime/pipeline_groups.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/queue_samples.h"

namespace rlf {
namespace {

using test::world_rank;
using test::world_size;

constexpr uint64_t kSeed = 20251129;

struct QueueLayout {
  std::string name;
  LayoutConfig config;
};

LayoutConfig layout(int learners, int actors, int queue_ranks, int shards, int ranks_per_node = 0) {
  LayoutConfig c;
  c.learners = learners;
  c.actors = actors;
  c.queue_ranks = queue_ranks;
  c.queue_shards = shards;
  c.ranks_per_node = ranks_per_node;
  return c;
}

// Producer/consumer layouts (at least one actor and one learner): shards hosted by learners, one
// dedicated queue rank, and two queue ranks, wherever the world size holds them.
std::vector<QueueLayout> producer_consumer_layouts() {
  const int w = world_size();
  std::vector<QueueLayout> layouts;
  if (w < 2) return layouts;
  layouts.push_back({"learner-hosted shards", layout(w / 2, w - w / 2, 0, 3)});
  if (w >= 3) layouts.push_back({"one queue rank", layout((w - 1) / 2, w - 1 - (w - 1) / 2, 1, 2)});
  if (w >= 6) layouts.push_back({"two queue ranks", layout(2, w - 4, 2, 3)});
  return layouts;
}

// The bytes one sample adds to a packed buffer (its metadata, tokens and log-probs).
uint64_t sample_bytes(const QueueSample& s) {
  return packed_bytes(std::span(&s, 1)) - kPackHeaderBytes;
}

uint64_t sum_over_world(uint64_t mine) {
  uint64_t total = 0;
  MPI_Allreduce(&mine, &total, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  return total;
}

std::vector<int64_t> gather_ids(const std::vector<int64_t>& mine) {
  const int n = int(mine.size());
  const size_t ranks = static_cast<size_t>(world_size());
  std::vector<int> counts(ranks), offsets(ranks);
  MPI_Allgather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, MPI_COMM_WORLD);
  std::exclusive_scan(counts.begin(), counts.end(), offsets.begin(), 0);
  std::vector<int64_t> all(static_cast<size_t>(offsets.back() + counts.back()));
  MPI_Allgatherv(mine.data(), n, MPI_INT64_T, all.data(), counts.data(), offsets.data(),
                 MPI_INT64_T, MPI_COMM_WORLD);
  std::sort(all.begin(), all.end());
  return all;
}

int index_in(const std::vector<int>& ranks, int rank) {
  return int(std::find(ranks.begin(), ranks.end(), rank) - ranks.begin());
}

// The i-th of `parts` near-equal shares of `total`.
int64_t share(int64_t total, int parts, int i) {
  return total / parts + (i < total % parts);
}

bool canonical(const std::vector<QueueSample>& batch) {
  for (size_t i = 1; i < batch.size(); ++i) {
    const auto& a = batch[i - 1];
    const auto& b = batch[i];
    if (!(a.prompt_id < b.prompt_id || (a.prompt_id == b.prompt_id && a.sample_id < b.sample_id)))
      return false;
  }
  return true;
}

// A seeded sample whose prompt ids are scrambled, so that canonical order is far from id order.
QueueSample scrambled_sample(uint64_t seed, int64_t sample_id) {
  QueueSample s = test::random_sample(seed, sample_id);
  s.prompt_id = (sample_id * 7919) % 13;
  return s;
}

// What a get of the ids [first, first + count) must return: those samples in canonical order.
std::vector<QueueSample> scrambled_range(uint64_t seed, int64_t first, int64_t count) {
  std::vector<QueueSample> want;
  for (int64_t id = first; id < first + count; ++id) want.push_back(scrambled_sample(seed, id));
  queue_protocol::canonical_sort(want);
  return want;
}

// Checks a batch a consumer got: canonical order and every sample identical to what its producer
// built from (seed, sample id); appends the ids.
void check_batch(const std::vector<QueueSample>& batch, uint64_t seed,
                 const test::SampleShape& shape, std::vector<int64_t>& ids) {
  EXPECT_TRUE(canonical(batch)) << "a get returned samples out of canonical order";
  for (const auto& s : batch) {
    EXPECT_EQ(s, test::random_sample(seed, s.sample_id, shape)) << "sample " << s.sample_id;
    ids.push_back(s.sample_id);
  }
}

// Sleeps up to `max_us` (seeded), serving any shards this rank hosts meanwhile.
void random_delay(DistQueue& queue, std::mt19937_64& gen, int max_us) {
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::microseconds(std::uniform_int_distribution<int>(0, max_us)(gen));
  queue.serve_until([&] { return std::chrono::steady_clock::now() >= until; });
}

// The world totals of the queue's counters that the tests compare with formulas.
struct WorldCounters {
  uint64_t put_requests, get_requests, rejected, put_bytes, reply_bytes, stored, served;
  uint64_t client_sent_msgs, client_sent_bytes, server_recv_msgs, server_recv_bytes;
  uint64_t server_sent_msgs, server_sent_bytes, client_recv_msgs, client_recv_bytes;
  uint64_t self_msgs, self_bytes, link_msgs, link_bytes;
};

WorldCounters world_counters(const DistQueue& q, const Links& links) {
  const auto& c = q.counters();
  const auto l = test::world_total(links.counters());
  return {sum_over_world(c.put_requests),
          sum_over_world(c.get_requests),
          sum_over_world(c.rejected_puts),
          sum_over_world(c.put_bytes),
          sum_over_world(c.reply_bytes),
          sum_over_world(c.samples_stored),
          sum_over_world(c.samples_served),
          sum_over_world(c.client_sent.messages),
          sum_over_world(c.client_sent.bytes),
          sum_over_world(c.server_received.messages),
          sum_over_world(c.server_received.bytes),
          sum_over_world(c.server_sent.messages),
          sum_over_world(c.server_sent.bytes),
          sum_over_world(c.client_received.messages),
          sum_over_world(c.client_received.bytes),
          sum_over_world(c.self.messages),
          sum_over_world(c.self.bytes),
          l.messages[0] + l.messages[1],
          l.bytes[0] + l.bytes[1]};
}

// Every message is seen by both ends, and exactly the ones between different ranks are in Links.
void expect_traffic_consistent(const WorldCounters& w) {
  EXPECT_EQ(w.client_sent_msgs, w.server_recv_msgs);
  EXPECT_EQ(w.client_sent_bytes, w.server_recv_bytes);
  EXPECT_EQ(w.server_sent_msgs, w.client_recv_msgs);
  EXPECT_EQ(w.server_sent_bytes, w.client_recv_bytes);
  EXPECT_EQ(w.link_msgs, w.client_sent_msgs + w.server_sent_msgs - w.self_msgs);
  EXPECT_EQ(w.link_bytes, w.client_sent_bytes + w.server_sent_bytes - w.self_bytes);
}

// Actors put `per_actor` samples each in random batches with random delays while learners get
// their share in random pieces; dedicated queue ranks only serve.
struct StreamResult {
  std::vector<int64_t> ids;     // every id any learner got, sorted, over the world
  uint64_t expected_put_bytes;  // sum over put messages of 32 + packed_bytes(message samples)
  uint64_t all_sample_bytes;    // sum over all samples of their packed bytes
  int64_t total;                // samples put
};

StreamResult run_stream(DistQueue& q, Topology& topology, int per_actor, int max_batch,
                        const test::SampleShape& shape, uint64_t seed,
                        int consumer_start_delay_us = 0) {
  const auto& actors = topology.ranks_of(Role::Actor);
  const auto& learners = topology.ranks_of(Role::Learner);
  const int64_t total = int64_t(actors.size()) * per_actor;
  std::mt19937_64 gen(seed ^ uint64_t(world_rank()));
  std::vector<int64_t> got;
  uint64_t put_bytes = 0, sample_bytes_sum = 0;
  if (topology.role() == Role::Actor) {
    const int a = index_in(actors, world_rank());
    // Interleaved ids (actor a owns a, a + A, ...), so every actor feeds every shard.
    int64_t next = 0;
    while (next < per_actor) {
      const int n = std::min<int>(per_actor - int(next),
                                  std::uniform_int_distribution<int>(1, max_batch)(gen));
      std::vector<QueueSample> batch;
      for (int i = 0; i < n; ++i)
        batch.push_back(test::random_sample(seed, (next + i) * int64_t(actors.size()) + a, shape));
      next += n;
      // What the client sends: per shard, runs of at most `capacity` samples, one message each.
      std::vector<std::vector<QueueSample>> by_shard(static_cast<size_t>(q.shards()));
      for (const auto& s : batch) {
        by_shard[size_t(queue_protocol::shard_of(s.sample_id, q.shards()))].push_back(s);
        sample_bytes_sum += sample_bytes(s);
      }
      for (const auto& samples : by_shard)
        for (size_t first = 0; first < samples.size(); first += size_t(q.shard_capacity()))
          put_bytes += queue_protocol::kHeaderBytes +
                       packed_bytes(std::span(samples).subspan(
                           first, std::min(samples.size() - first, size_t(q.shard_capacity()))));
      random_delay(q, gen, 2000);
      q.put(std::move(batch));
    }
  } else if (topology.role() == Role::Learner) {
    if (consumer_start_delay_us > 0) {
      const auto until =
          std::chrono::steady_clock::now() + std::chrono::microseconds(consumer_start_delay_us);
      q.serve_until([&] { return std::chrono::steady_clock::now() >= until; });
    }
    int64_t left = share(total, int(learners.size()), index_in(learners, world_rank()));
    while (left > 0) {
      const int64_t n = std::min<int64_t>(left, std::uniform_int_distribution<int>(1, 9)(gen));
      random_delay(q, gen, 1500);
      const auto batch = q.get(n);
      EXPECT_EQ(int64_t(batch.size()), n);
      check_batch(batch, seed, shape, got);
      left -= n;
    }
  }
  q.close();
  return {gather_ids(got), sum_over_world(put_bytes), sum_over_world(sample_bytes_sum), total};
}

std::vector<int64_t> all_ids(int64_t total) {
  std::vector<int64_t> ids(static_cast<size_t>(total));
  std::iota(ids.begin(), ids.end(), 0);
  return ids;
}

TEST(DistQueue, ConcurrentProducersAndConsumersDeliverEverySampleExactlyOnce) {
  if (world_size() < 2) GTEST_SKIP() << "needs an actor and a learner";
  for (const auto& [name, config] : producer_consumer_layouts()) {
    SCOPED_TRACE(name);
    Topology topology(MPI_COMM_WORLD, config);
    DistQueue q(MPI_COMM_WORLD, topology, {.shard_capacity = 1024});
    topology.links().reset_counters();
    const test::SampleShape shape;
    const auto result = run_stream(q, topology, 48, 8, shape, kSeed);
    EXPECT_EQ(result.ids, all_ids(result.total));

    const auto w = world_counters(q, topology.links());
    expect_traffic_consistent(w);
    EXPECT_EQ(w.rejected, 0u);  // 1024 per shard never fills here
    EXPECT_EQ(w.stored, uint64_t(result.total));
    EXPECT_EQ(w.served, uint64_t(result.total));
    // Puts: one message per shard a batch touches, each 32 + packed_bytes(its samples).
    EXPECT_EQ(w.put_bytes, result.expected_put_bytes);
    // Replies: each one 32 + a 32-byte pack header + its samples; every sample went out once.
    EXPECT_EQ(w.reply_bytes, 64 * w.get_requests + result.all_sample_bytes);
  }
}

TEST(DistQueue, BackPressureWithATinyCapacityStillDeliversEverything) {
  if (world_size() < 2) GTEST_SKIP() << "needs an actor and a learner";
  for (const auto& [name, config] : producer_consumer_layouts()) {
    SCOPED_TRACE(name);
    Topology topology(MPI_COMM_WORLD, config);
    DistQueue q(MPI_COMM_WORLD, topology, {.shard_capacity = 1});
    q.barrier();
    const test::SampleShape shape;
    // Batches of up to 6 samples over <= 3 shards of capacity 1, consumers starting late: the
    // second message to a shard finds it full.
    const auto result = run_stream(q, topology, 30, 6, shape, kSeed + 1, 200000);
    EXPECT_EQ(result.ids, all_ids(result.total));

    const auto w = world_counters(q, topology.links());
    expect_traffic_consistent(w);
    EXPECT_GT(w.rejected, 0u) << "the queue never pushed back";
    // Capacity 1: every stored message holds one sample; refused ones were sent again.
    EXPECT_EQ(w.put_requests - w.rejected, uint64_t(result.total));
    EXPECT_EQ(w.stored, uint64_t(result.total));
    EXPECT_EQ(w.served, uint64_t(result.total));
  }
}

TEST(DistQueue, VersionPolicyNeverReturnsTooOldSamples) {
  if (world_size() < 2) GTEST_SKIP() << "needs an actor and a learner";
  constexpr int32_t kVMin = 3;
  for (const auto& [name, config] : producer_consumer_layouts()) {
    SCOPED_TRACE(name);
    Topology topology(MPI_COMM_WORLD, config);
    DistQueue q(MPI_COMM_WORLD, topology, {.shard_capacity = 64});
    const auto& actors = topology.ranks_of(Role::Actor);
    const auto& learners = topology.ranks_of(Role::Learner);
    const int per_actor = 40;
    const int64_t total = int64_t(actors.size()) * per_actor;
    test::SampleShape shape;
    shape.max_version = 5;
    int64_t fresh = 0;
    for (int64_t id = 0; id < total; ++id)
      fresh += test::random_sample(kSeed + 2, id, shape).version_min >= kVMin;
    std::mt19937_64 gen(kSeed ^ uint64_t(world_rank()));
    std::vector<int64_t> got;

    if (topology.role() == Role::Actor) {
      const int a = index_in(actors, world_rank());
      for (int first = 0; first < per_actor; first += 5) {
        std::vector<QueueSample> batch;
        for (int i = first; i < first + 5; ++i)
          batch.push_back(
              test::random_sample(kSeed + 2, int64_t(i) * int64_t(actors.size()) + a, shape));
        random_delay(q, gen, 1000);
        q.put(std::move(batch));
      }
    } else if (topology.role() == Role::Learner) {
      // Concurrently with the puts: only fresh samples, blocking until they exist.
      const auto batch =
          q.get(share(fresh, int(learners.size()), index_in(learners, world_rank())), kVMin);
      for (const auto& s : batch) EXPECT_GE(s.version_min, kVMin) << "sample " << s.sample_id;
      check_batch(batch, kSeed + 2, shape, got);
    }
    q.barrier();
    // Every fresh sample is gone, so what is left is exactly the old ones.
    if (topology.role() == Role::Learner) {
      const auto batch =
          q.get(share(total - fresh, int(learners.size()), index_in(learners, world_rank())));
      for (const auto& s : batch) EXPECT_LT(s.version_min, kVMin) << "sample " << s.sample_id;
      check_batch(batch, kSeed + 2, shape, got);
    }
    q.close();
    EXPECT_EQ(gather_ids(got), all_ids(total));
  }
}

TEST(DistQueue, OneGetAssemblesEverySampleInCanonicalOrder) {
  // Any world size, one rank included (a single learner serving every shard to itself).
  LayoutConfig config;
  config.queue_shards = 3;
  Topology topology(MPI_COMM_WORLD, config);
  DistQueue q(MPI_COMM_WORLD, topology, {.shard_capacity = 256});
  const int per_rank = 25;
  const int w = world_size();
  test::SampleShape shape;
  // Ids interleaved over ranks and prompts shuffled so that arrival order is far from canonical.
  std::vector<QueueSample> mine;
  for (int i = 0; i < per_rank; ++i) {
    auto s = test::random_sample(kSeed + 3, int64_t(i) * w + world_rank(), shape);
    s.prompt_id = (s.sample_id * 7919) % 13;
    mine.push_back(std::move(s));
  }
  std::reverse(mine.begin(), mine.end());
  q.put(mine);
  q.barrier();
  if (world_rank() == 0) {
    std::vector<QueueSample> want;
    for (int64_t id = 0; id < int64_t(per_rank) * w; ++id) {
      auto s = test::random_sample(kSeed + 3, id, shape);
      s.prompt_id = (s.sample_id * 7919) % 13;
      want.push_back(std::move(s));
    }
    queue_protocol::canonical_sort(want);
    EXPECT_EQ(q.get(int64_t(per_rank) * w), want);
  }
  q.close();
  const auto w_counters = world_counters(q, topology.links());
  expect_traffic_consistent(w_counters);
  EXPECT_EQ(w_counters.served, uint64_t(per_rank) * uint64_t(w));
}

TEST(DistQueue, GetRangeBlocksUntilItsIdsArriveAndReturnsExactlyThemInCanonicalOrder) {
  if (world_size() < 2) GTEST_SKIP() << "needs an actor and a learner";
  for (const auto& [name, config] : producer_consumer_layouts()) {
    SCOPED_TRACE(name);
    Topology topology(MPI_COMM_WORLD, config);
    DistQueue q(MPI_COMM_WORLD, topology, {.shard_capacity = 1024});
    const auto& actors = topology.ranks_of(Role::Actor);
    const auto& learners = topology.ranks_of(Role::Learner);
    const int per_actor = 36;
    const int64_t total = int64_t(actors.size()) * per_actor;
    const uint64_t seed = kSeed + 5;
    std::mt19937_64 gen(seed ^ uint64_t(world_rank()));
    std::vector<int64_t> got;
    uint64_t range_calls = 0;
    if (topology.role() == Role::Actor) {
      // Late and in random pieces, so that learners ask before their ids exist and see them
      // arrive a few at a time.
      const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
      q.serve_until([&] { return std::chrono::steady_clock::now() >= until; });
      const int a = index_in(actors, world_rank());
      for (int next = per_actor; next > 0;) {
        const int n = std::min(next, std::uniform_int_distribution<int>(1, 7)(gen));
        std::vector<QueueSample> batch;
        for (int i = next - n; i < next; ++i)
          batch.push_back(scrambled_sample(seed, int64_t(i) * int64_t(actors.size()) + a));
        next -= n;
        random_delay(q, gen, 3000);
        q.put(std::move(batch));
      }
    } else if (topology.role() == Role::Learner) {
      // Learner i takes the i-th block of ids, in consecutive ranges of random length.
      const int i = index_in(learners, world_rank());
      int64_t first = 0;
      for (int j = 0; j < i; ++j) first += share(total, int(learners.size()), j);
      const int64_t end = first + share(total, int(learners.size()), i);
      while (first < end) {
        const int64_t n =
            std::min<int64_t>(end - first, std::uniform_int_distribution<int>(1, 9)(gen));
        const auto batch = q.get_range(first, n);
        ++range_calls;
        EXPECT_EQ(batch, scrambled_range(seed, first, n))
            << "range [" << first << ", +" << n << ")";
        for (const auto& s : batch) got.push_back(s.sample_id);
        first += n;
      }
    }
    q.close();
    EXPECT_EQ(gather_ids(got), all_ids(total));
    const auto w = world_counters(q, topology.links());
    expect_traffic_consistent(w);
    EXPECT_EQ(w.served, uint64_t(total));
    // Learners asked before the samples were there, and asked again until they were.
    EXPECT_GT(sum_over_world(q.counters().get_rounds), sum_over_world(range_calls));
  }
}

TEST(DistQueue, GetRangeTakesAnyRangeFromEveryShardAndRejectsEmptyOrNegativeRanges) {
  // Any world size, one rank included. Every rank puts interleaved ids and then takes a
  // contiguous block, so its range spans every shard and every rank's puts.
  for (int shards : {1, 3, 4}) {
    SCOPED_TRACE("shards " + std::to_string(shards));
    LayoutConfig config;
    config.queue_shards = shards;
    Topology topology(MPI_COMM_WORLD, config);
    DistQueue q(MPI_COMM_WORLD, topology, {.shard_capacity = 256});
    EXPECT_THROW(q.get_range(0, 0), std::invalid_argument);
    EXPECT_THROW(q.get_range(4, -1), std::invalid_argument);
    EXPECT_THROW(q.get_range(-1, 3), std::invalid_argument);
    EXPECT_THROW(q.get_range_hierarchical(0, 0, topology.role_comm()), std::invalid_argument);
    EXPECT_THROW(q.get_range_hierarchical(-2, 1, topology.role_comm()), std::invalid_argument);
    const int per_rank = 17;
    const int w = world_size();
    const uint64_t seed = kSeed + 6 + uint64_t(shards);
    std::vector<QueueSample> mine;
    for (int i = 0; i < per_rank; ++i)
      mine.push_back(scrambled_sample(seed, int64_t(i) * w + world_rank()));
    std::reverse(mine.begin(), mine.end());
    q.put(mine);
    q.barrier();
    const int64_t first = int64_t(world_rank()) * per_rank;
    EXPECT_EQ(q.get_range(first, per_rank), scrambled_range(seed, first, per_rank));
    q.barrier();
    for (int s : q.hosted_shards()) EXPECT_EQ(q.shard(s).stored(), 0) << "shard " << s;
    q.close();
  }
}

// Learners on virtual nodes of `g` ranks: the layouts where a hierarchical get means something.
std::vector<QueueLayout> hierarchical_layouts() {
  std::vector<QueueLayout> layouts;
  if (world_size() == 4) {
    layouts.push_back({"2 learners per node, learner-hosted shards", layout(2, 2, 0, 2, 2)});
    layouts.push_back({"2 learners per node, one queue rank", layout(2, 1, 1, 2, 2)});
  } else if (world_size() == 6) {
    layouts.push_back({"3 learners per node, learner-hosted shards", layout(3, 3, 0, 3, 3)});
    layouts.push_back({"2 nodes of 2 learners, one queue rank", layout(4, 1, 1, 2, 2)});
  }
  return layouts;
}

TEST(DistQueue, HierarchicalGetCutsQueueRequestsByTheGroupSize) {
  if (hierarchical_layouts().empty()) GTEST_SKIP() << "needs learner nodes of >= 2 ranks (4, 6)";
  for (const auto& [name, config] : hierarchical_layouts()) {
    SCOPED_TRACE(name);
    Topology topology(MPI_COMM_WORLD, config);
    DistQueue q(MPI_COMM_WORLD, topology, {.shard_capacity = 1024});
    const auto& actors = topology.ranks_of(Role::Actor);
    const int learners = int(topology.ranks_of(Role::Learner).size());
    const int shards = q.shards();
    const int g = config.ranks_per_node;    // learners fill whole nodes in these layouts
    const int64_t per_member = 4 * shards;  // divisible by the shard count: one round per get
    const int64_t phase_total = per_member * learners;
    const test::SampleShape shape;

    // Each phase: actors put ids [base, base + phase_total) (so every shard holds exactly its
    // share), everyone waits, then learners get: flat or hierarchical.
    auto run_phase = [&](int64_t base, bool hierarchical) {
      if (topology.role() == Role::Actor) {
        const int a = index_in(actors, world_rank());
        std::vector<QueueSample> batch;
        for (int64_t id = base + a; id < base + phase_total; id += int64_t(actors.size()))
          batch.push_back(test::random_sample(kSeed + 4, id, shape));
        q.put(std::move(batch));
      }
      // Reset before the barrier: a rank that leaves it first may ask a server still inside it.
      q.reset_counters();
      q.barrier();
      std::vector<int64_t> got;
      if (topology.role() == Role::Learner) {
        const auto batch = hierarchical ? q.get_hierarchical(per_member, DistQueue::kAnyVersion,
                                                             topology.role_comm())
                                        : q.get(per_member);
        EXPECT_EQ(int64_t(batch.size()), per_member);
        check_batch(batch, kSeed + 4, shape, got);
      }
      q.barrier();
      std::vector<int64_t> want(static_cast<size_t>(phase_total));
      std::iota(want.begin(), want.end(), base);
      EXPECT_EQ(gather_ids(got), want);
      return world_counters(q, topology.links());
    };
    constexpr int64_t kHierBase = 1000000;
    const auto flat = run_phase(0, false);
    const auto hier = run_phase(kHierBase, true);
    q.close();

    EXPECT_EQ(flat.get_requests, uint64_t(learners * shards));
    EXPECT_EQ(hier.get_requests, uint64_t(learners / g * shards));
    EXPECT_EQ(hier.get_requests * uint64_t(g), flat.get_requests);
    EXPECT_EQ(flat.served, uint64_t(phase_total));
    EXPECT_EQ(hier.served, uint64_t(phase_total));
    // Each reply is 32 + a 32-byte pack header + its samples, every sample served once: the
    // hierarchical phase saves exactly the headers of the replies it does not need.
    auto phase_sample_bytes = [&](int64_t base) {
      uint64_t bytes = 0;
      for (int64_t id = base; id < base + phase_total; ++id)
        bytes += sample_bytes(test::random_sample(kSeed + 4, id, shape));
      return bytes;
    };
    EXPECT_EQ(flat.reply_bytes, 64 * flat.get_requests + phase_sample_bytes(0));
    EXPECT_EQ(hier.reply_bytes, 64 * hier.get_requests + phase_sample_bytes(kHierBase));
  }
}

// StaleSync's bound in the transport: a range get at v_min hands out only samples with
// version_min >= v_min, and the shards discard the older ones (counted) so no one waits for them.
TEST(DistQueue, GetRangeNeverHandsOutSamplesOlderThanTheBound) {
  if (world_size() < 2) GTEST_SKIP() << "needs an actor and a learner";
  // Flat gets on every producer/consumer layout; flat and hierarchical on learner nodes.
  std::vector<std::pair<QueueLayout, bool>> cases;
  for (const auto& l : producer_consumer_layouts()) cases.push_back({l, false});
  for (const auto& l : hierarchical_layouts()) {
    cases.push_back({l, false});
    cases.push_back({l, true});
  }
  for (const auto& [queue_layout, use_hierarchical] : cases) {
    const auto& [name, config] = queue_layout;
    {
      SCOPED_TRACE(name + (use_hierarchical ? ", hierarchical" : ", flat"));
      Topology topology(MPI_COMM_WORLD, config);
      DistQueue q(MPI_COMM_WORLD, topology, {.shard_capacity = 1024});
      const auto& actors = topology.ranks_of(Role::Actor);
      const auto& learners = topology.ranks_of(Role::Learner);
      const int64_t per_member = 4 * q.shards() + 1;
      const int64_t total = per_member * int64_t(learners.size());
      const uint64_t seed = kSeed + 11;
      const int32_t v_min = 3;  // random_sample versions are 0..5: about half are too old
      if (topology.role() == Role::Actor) {
        const int a = index_in(actors, world_rank());
        std::vector<QueueSample> batch;
        for (int64_t id = a; id < total; id += int64_t(actors.size()))
          batch.push_back(scrambled_sample(seed, id));
        q.put(std::move(batch));
      }
      q.barrier();
      std::vector<int64_t> got;
      if (topology.role() == Role::Learner) {
        const int64_t first = index_in(learners, world_rank()) * per_member;
        const auto batch = use_hierarchical ? q.get_range_hierarchical(first, per_member,
                                                                       topology.role_comm(), v_min)
                                            : q.get_range(first, per_member, v_min);
        std::vector<QueueSample> want;
        for (const QueueSample& s : scrambled_range(seed, first, per_member))
          if (s.version_min >= v_min) want.push_back(s);
        EXPECT_EQ(batch, want);
        for (const auto& s : batch) got.push_back(s.sample_id);
      }
      q.barrier();
      uint64_t too_old = 0;
      for (int64_t id = 0; id < total; ++id)
        too_old += scrambled_sample(seed, id).version_min < v_min;
      ASSERT_GT(too_old, 0u);
      EXPECT_EQ(gather_ids(got).size(), size_t(total) - too_old);
      EXPECT_EQ(sum_over_world(q.counters().stale_discarded), too_old);
      // Flat: each learner counts its own; hierarchical: the leader counts the node's.
      EXPECT_EQ(sum_over_world(q.counters().stale_skipped), too_old);
      for (int s : q.hosted_shards()) EXPECT_EQ(q.shard(s).stored(), 0) << "shard " << s;
      q.close();
    }
  }
}

TEST(DistQueue, HierarchicalGetRangeGivesEachMemberItsRangeForFewerRequests) {
  if (hierarchical_layouts().empty()) GTEST_SKIP() << "needs learner nodes of >= 2 ranks (4, 6)";
  for (const auto& [name, config] : hierarchical_layouts()) {
    SCOPED_TRACE(name);
    Topology topology(MPI_COMM_WORLD, config);
    DistQueue q(MPI_COMM_WORLD, topology, {.shard_capacity = 1024});
    const auto& actors = topology.ranks_of(Role::Actor);
    const auto& learners = topology.ranks_of(Role::Learner);
    const int shards = q.shards();
    const int g = config.ranks_per_node;    // learners fill whole nodes in these layouts
    const int64_t per_member = 3 * shards;  // every member's range spans every shard
    const int64_t phase_total = per_member * int64_t(learners.size());
    const uint64_t seed = kSeed + 7;

    // Each phase: actors put ids [base, base + phase_total), everyone waits, then learner i takes
    // ids [base + i x per_member, + per_member): flat or hierarchical.
    auto run_phase = [&](int64_t base, bool hierarchical) {
      if (topology.role() == Role::Actor) {
        const int a = index_in(actors, world_rank());
        std::vector<QueueSample> batch;
        for (int64_t id = base + a; id < base + phase_total; id += int64_t(actors.size()))
          batch.push_back(scrambled_sample(seed, id));
        q.put(std::move(batch));
      }
      // Reset before the barrier: a rank that leaves it first may ask a server still inside it.
      q.reset_counters();
      q.barrier();
      std::vector<int64_t> got;
      if (topology.role() == Role::Learner) {
        const int64_t first = base + index_in(learners, world_rank()) * per_member;
        const auto batch = hierarchical
                               ? q.get_range_hierarchical(first, per_member, topology.role_comm())
                               : q.get_range(first, per_member);
        EXPECT_EQ(batch, scrambled_range(seed, first, per_member));
        for (const auto& s : batch) got.push_back(s.sample_id);
      }
      q.barrier();
      std::vector<int64_t> want(static_cast<size_t>(phase_total));
      std::iota(want.begin(), want.end(), base);
      EXPECT_EQ(gather_ids(got), want);
      return world_counters(q, topology.links());
    };
    constexpr int64_t kHierBase = 1000000;
    const auto flat = run_phase(0, false);
    const auto hier = run_phase(kHierBase, true);
    q.close();

    // One round each (every id was there): one request per shard per asking rank.
    EXPECT_EQ(flat.get_requests, uint64_t(learners.size()) * uint64_t(shards));
    EXPECT_EQ(hier.get_requests * uint64_t(g), flat.get_requests);
    EXPECT_EQ(flat.served, uint64_t(phase_total));
    EXPECT_EQ(hier.served, uint64_t(phase_total));
    // A GetRange is a header and a range (the servers may also count puts they stored while in
    // the barrier); its reply a header, a pack header and the samples.
    for (const auto& phase : {flat, hier})
      EXPECT_EQ(phase.server_recv_bytes - phase.put_bytes,
                phase.get_requests * (queue_protocol::kHeaderBytes + queue_protocol::kRangeBytes));
    auto phase_sample_bytes = [&](int64_t base) {
      uint64_t bytes = 0;
      for (int64_t id = base; id < base + phase_total; ++id)
        bytes += sample_bytes(scrambled_sample(seed, id));
      return bytes;
    };
    EXPECT_EQ(flat.reply_bytes, 64 * flat.get_requests + phase_sample_bytes(0));
    EXPECT_EQ(hier.reply_bytes, 64 * hier.get_requests + phase_sample_bytes(kHierBase));
  }
}

// A model-parallel group (a TP group, a pipeline) whose every rank trains the same samples: one
// leader per group fetches them and fans them out inside the group, so the queue serves each
// sample once per group. Against every rank of the group fetching its own copy (put once per rank
// under its own ids, same contents): exactly 1/g of the requests, reply bytes and samples served.
// `group` (null on non-learners) is this learner's group of g ranks, `replica` its index.
void check_leader_get_cuts_queue_load(Topology& topology, int g, const HierarchicalComm* group,
                                      int replica) {
  const bool learner = topology.role() == Role::Learner;
  DistQueue q(MPI_COMM_WORLD, topology, {.shard_capacity = 1024});
  const auto& actors = topology.ranks_of(Role::Actor);
  const auto& learners = topology.ranks_of(Role::Learner);
  const int groups = int(learners.size()) / g;
  const int64_t per_group = 3 * q.shards();  // every group's range spans every shard
  const uint64_t seed = kSeed + 9;
  // The samples of group k's batch: contents of ids [k per_group, (k + 1) per_group).
  auto content = [&](int64_t id, int64_t as_id) {
    QueueSample sample = scrambled_sample(seed, id);
    sample.sample_id = as_id;
    return sample;
  };

  // Phase 1, every rank of a group its own copy: rank m of group k gets ids
  // base + (k g + m) per_group + j with the contents of group k's sample j.
  // Phase 2, one leader per group: ids base + k per_group + j, the same contents.
  auto run_phase = [&](int64_t base, bool leader_get) {
    const int64_t copies = leader_get ? 1 : g;
    if (topology.role() == Role::Actor) {
      const int a = index_in(actors, world_rank());
      std::vector<QueueSample> batch;
      for (int64_t k = 0; k < groups; ++k)
        for (int64_t m = 0; m < copies; ++m)
          for (int64_t j = a; j < per_group; j += int64_t(actors.size()))
            batch.push_back(content(k * per_group + j, base + (k * copies + m) * per_group + j));
      q.put(std::move(batch));
    }
    q.reset_counters();
    q.barrier();
    if (learner) {
      const int k = replica, m = group->rank();
      const auto batch = leader_get
                             ? q.get_range_replicated(base + k * per_group, per_group, *group)
                             : q.get_range(base + (int64_t(k) * g + m) * per_group, per_group);
      // Every rank of the group trains group k's samples, in canonical order.
      const int64_t first = leader_get ? base + k * per_group : base + (k * g + m) * per_group;
      std::vector<QueueSample> want;
      for (int64_t j = 0; j < per_group; ++j) want.push_back(content(k * per_group + j, first + j));
      queue_protocol::canonical_sort(want);
      EXPECT_EQ(batch, want);
    }
    q.barrier();
    return world_counters(q, topology.links());
  };
  const auto own_copies = run_phase(0, false);
  const auto leader = run_phase(1000000, true);
  q.close();

  EXPECT_EQ(own_copies.get_requests, uint64_t(learners.size()) * uint64_t(q.shards()));
  EXPECT_EQ(leader.get_requests * uint64_t(g), own_copies.get_requests);
  EXPECT_EQ(leader.served * uint64_t(g), own_copies.served);
  EXPECT_EQ(leader.reply_bytes * uint64_t(g), own_copies.reply_bytes);
  // Requests are the same size either way: the servers receive exactly 1/g of the bytes.
  EXPECT_EQ((leader.server_recv_bytes - leader.put_bytes) * uint64_t(g),
            own_copies.server_recv_bytes - own_copies.put_bytes);
}

// Only the model's widths (and layers, for pipelines) matter: 6 heads and a shared expert of 6
// fit TP 2 and 3, 6 layers PP 2 and 3.
ModelConfig group_test_model() {
  ModelConfig model;
  model.vocab_size = 8;
  model.d_model = 12;
  model.n_layers = 6;
  model.n_heads = 6;
  model.n_experts = 2;
  model.top_k = 1;
  model.d_ff = 4;
  model.shared_expert_d_ff = 6;
  model.max_seq_len = 8;
  return model;
}

// Tensor parallelism: every rank of a TP group trains the same samples.
TEST(DistQueue, TensorParallelLeaderGetCutsQueueLoadToOneOverTP) {
  if (hierarchical_layouts().empty()) GTEST_SKIP() << "needs learner nodes of >= 2 ranks (4, 6)";
  for (const auto& [name, config] : hierarchical_layouts()) {
    SCOPED_TRACE(name);
    Topology topology(MPI_COMM_WORLD, config);
    const int g = config.ranks_per_node;  // TP degree: learners fill whole nodes here
    std::unique_ptr<TensorParallel> tp;
    if (topology.role() == Role::Learner) {
      tp = std::make_unique<TensorParallel>(topology.role_comm().comm, g, false, group_test_model(),
                                            topology.links());
      ASSERT_EQ(tp->group().size(), g);
      ASSERT_EQ(tp->group().node_count(), 1) << "a TP group inside one node";
    }
    check_leader_get_cuts_queue_load(topology, g, tp ? &tp->group() : nullptr,
                                     tp ? tp->replica() : 0);
  }
}

// Pipeline parallelism (train --pipeline-parallel): every stage of a pipeline trains the same
// samples, so one leader per pipeline fetches them.
TEST(DistQueue, PipelineLeaderGetCutsQueueLoadToOneOverPP) {
  if (hierarchical_layouts().empty()) GTEST_SKIP() << "needs learner nodes of >= 2 ranks (4, 6)";
  for (const auto& [name, config] : hierarchical_layouts()) {
    SCOPED_TRACE(name);
    Topology topology(MPI_COMM_WORLD, config);
    const int p = config.ranks_per_node;  // a pipeline inside one node
    std::unique_ptr<PipelineGroups> pp;
    if (topology.role() == Role::Learner) {
      pp = std::make_unique<PipelineGroups>(topology.role_comm().comm, PipelineShape{p, p, 1},
                                            group_test_model(), topology.links());
      ASSERT_EQ(pp->pipeline().size(), p);
      ASSERT_EQ(pp->pipeline().node_count(), 1) << "a pipeline inside one node";
    }
    check_leader_get_cuts_queue_load(topology, p, pp ? &pp->pipeline() : nullptr,
                                     pp ? pp->replica() : 0);
  }
}

// A pipeline spanning nodes (every rank its own node, as `train --ranks-per-node 1` lays out a
// pipeline of 2 ranks): still one leader for the whole pipeline, the fan-out crossing nodes. (A
// leader per node hung: the first took the range from the queue, the second waited for it.)
TEST(DistQueue, PipelineAcrossNodesHasOneLeader) {
  if (world_size() < 4) GTEST_SKIP() << "needs 2 learners and 2 actors";
  const QueueLayout across{"2 learners on nodes of their own, learner-hosted shards",
                           layout(2, world_size() - 2, 0, 2, 1)};
  SCOPED_TRACE(across.name);
  Topology topology(MPI_COMM_WORLD, across.config);
  std::unique_ptr<PipelineGroups> pp;
  if (topology.role() == Role::Learner) {
    pp = std::make_unique<PipelineGroups>(topology.role_comm().comm, PipelineShape{2, 2, 1},
                                          group_test_model(), topology.links());
    ASSERT_EQ(pp->pipeline().node_count(), 2) << "a pipeline over two nodes";
  }
  check_leader_get_cuts_queue_load(topology, 2, pp ? &pp->pipeline() : nullptr,
                                   pp ? pp->replica() : 0);
}

// TP x PP inside `train` (--tensor-parallel 2 --pipeline-parallel 2): every rank of a model
// replica, T x P = 4 ranks, trains the same samples, so one leader per replica fetches them: the
// queue's load falls to exactly 1/(T x P), wherever its ranks are
// (PipelineAcrossNodesHasOneLeader).
TEST(DistQueue, TensorPipelineLeaderGetCutsQueueLoadToOneOverTPxPP) {
  if (world_size() != 6) GTEST_SKIP() << "needs 4 learners on one node and an actor (6 ranks)";
  const std::vector<QueueLayout> layouts = {
      {"4 learners and 2 actors on one node, learner-hosted shards", layout(4, 2, 0, 2, 6)},
      {"4 learners, an actor and a queue rank on one node", layout(4, 1, 1, 2, 6)}};
  for (const auto& [name, config] : layouts) {
    SCOPED_TRACE(name);
    Topology topology(MPI_COMM_WORLD, config);
    std::unique_ptr<TensorParallel> tp;
    std::unique_ptr<PipelineGroups> pp;
    if (topology.role() == Role::Learner) {
      const MPI_Comm learners = topology.role_comm().comm;
      tp = std::make_unique<TensorParallel>(learners, 2, false, group_test_model(),
                                            topology.links());
      pp = std::make_unique<PipelineGroups>(learners, PipelineShape{2, 2, 1}, group_test_model(),
                                            topology.links(), tp.get());
      ASSERT_EQ(pp->model_parallel().size(), 4);
      ASSERT_EQ(pp->pipeline().size(), 2);
      ASSERT_EQ(pp->model_parallel().node_count(), 1) << "a model replica inside one node";
    }
    check_leader_get_cuts_queue_load(topology, 4, pp ? &pp->model_parallel() : nullptr,
                                     pp ? pp->replica() : 0);
  }
}

}  // namespace
}  // namespace rlf
