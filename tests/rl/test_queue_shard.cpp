// DistQueue's shard storage and protocol rules, without MPI: bounded all-or-nothing puts, FIFO
// and version-policy takes, counters, and the shard/demand/ordering rules both sides share.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "kernels/error.h"
#include "src/roles/queue_protocol.h"
#include "src/roles/queue_shard.h"
#include "src/roles/sample_packing.h"
#include "tests/queue_samples.h"

namespace rlf {
namespace {

std::vector<int64_t> ids_of(const std::vector<QueueSample>& samples) {
  std::vector<int64_t> ids;
  for (const auto& s : samples) ids.push_back(s.sample_id);
  return ids;
}

TEST(QueueShard, CapacityMustBePositive) {
  EXPECT_THROW(QueueShard(0), ConfigError);
  EXPECT_THROW(QueueShard(-3), ConfigError);
  EXPECT_NO_THROW(QueueShard(1));
}

TEST(QueueShard, PutIsAllOrNothing) {
  QueueShard shard(5);
  auto first = test::random_batch(1, 0, 3);
  EXPECT_TRUE(shard.put(first));
  EXPECT_TRUE(first.empty());  // moved in
  auto second = test::random_batch(1, 3, 3);
  const auto second_copy = second;
  EXPECT_FALSE(shard.put(second));  // 3 > 2 free: none stored
  EXPECT_EQ(second, second_copy);   // and the caller still has them to retry
  EXPECT_EQ(shard.stored(), 3);
  EXPECT_EQ(shard.rejected_puts(), 1);
  auto two = test::random_batch(1, 6, 2);
  EXPECT_TRUE(shard.put(two));
  EXPECT_EQ(shard.free_slots(), 0);
  std::vector<QueueSample> none;
  EXPECT_TRUE(shard.put(none));  // an empty batch always fits
  // A batch that can never fit is the caller's bug, not back-pressure.
  auto huge = test::random_batch(1, 10, 6);
  EXPECT_THROW(shard.put(huge), std::invalid_argument);
}

TEST(QueueShard, TakesOldestFirstAndFreesSpace) {
  QueueShard shard(4);
  auto batch = test::random_batch(2, 10, 4);
  const auto original = batch;
  ASSERT_TRUE(shard.put(batch));
  const auto got = shard.take(3);
  ASSERT_EQ(got.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(got[i], original[i]);
  auto more = test::random_batch(2, 20, 3);
  EXPECT_TRUE(shard.put(more));
  EXPECT_EQ(ids_of(shard.take(10)), (std::vector<int64_t>{13, 20, 21, 22}));
  EXPECT_TRUE(shard.take(1).empty());
  EXPECT_TRUE(shard.take(0).empty());
  EXPECT_EQ(shard.total_stored(), 7);
  EXPECT_EQ(shard.total_served(), 7);
}

TEST(QueueShard, VersionPolicyNeverReturnsTooOldSamples) {
  QueueShard shard(100);
  std::mt19937 gen(5);
  auto batch = test::random_batch(3, 0, 60);
  for (auto& s : batch) {
    s.version_min = int32_t(gen() % 6);
    s.version_max = s.version_min;
  }
  const auto original = batch;
  ASSERT_TRUE(shard.put(batch));
  EXPECT_EQ(shard.available(), 60);
  int64_t fresh = 0;
  for (const auto& s : original) fresh += s.version_min >= 3;
  EXPECT_EQ(shard.available(3), fresh);

  auto got = shard.take(7, 3);
  ASSERT_EQ(int64_t(got.size()), std::min<int64_t>(7, fresh));
  for (const auto& s : got) EXPECT_GE(s.version_min, 3);
  // Oldest eligible first: the first 7 samples of the original order with version_min >= 3.
  std::vector<int64_t> want;
  for (const auto& s : original)
    if (s.version_min >= 3 && want.size() < 7) want.push_back(s.sample_id);
  EXPECT_EQ(ids_of(got), want);

  // The rest drains: every sample once, the too-old ones kept in their order for a looser taker.
  auto rest_fresh = shard.take(1000, 3);
  for (const auto& s : rest_fresh) EXPECT_GE(s.version_min, 3);
  EXPECT_EQ(shard.available(3), 0);
  auto old = shard.take(1000);
  for (const auto& s : old) EXPECT_LT(s.version_min, 3);
  std::vector<int64_t> want_old;
  for (const auto& s : original)
    if (s.version_min < 3) want_old.push_back(s.sample_id);
  EXPECT_EQ(ids_of(old), want_old);
  EXPECT_EQ(got.size() + rest_fresh.size() + old.size(), original.size());
}

TEST(QueueShard, TakeRangeReturnsExactlyTheRangeOldestFirstAndKeepsTheRest) {
  QueueShard shard(100);
  auto batch = test::random_batch(6, 0, 30);
  std::shuffle(batch.begin(), batch.end(), std::mt19937(2));  // arrival order far from id order
  const auto original = batch;
  ASSERT_TRUE(shard.put(batch));
  const auto got = shard.take_range(10, 8);
  std::vector<int64_t> want, want_rest;
  for (const auto& s : original)
    (s.sample_id >= 10 && s.sample_id < 18 ? want : want_rest).push_back(s.sample_id);
  EXPECT_EQ(ids_of(got), want);  // in arrival order, every version
  EXPECT_TRUE(shard.take_range(10, 8).empty());
  EXPECT_TRUE(shard.take_range(100, 5).empty());
  EXPECT_EQ(shard.total_served(), 8);
  EXPECT_EQ(ids_of(shard.take(1000)), want_rest);
}

TEST(QueueShard, TakeRangeDiscardsSamplesOlderThanTheBoundAndCountsThem) {
  QueueShard shard(100);
  auto batch = test::random_batch(9, 0, 40);
  const auto original = batch;
  ASSERT_TRUE(shard.put(batch));
  int64_t stale = -1;
  const auto got = shard.take_range(5, 30, /*v_min=*/2, &stale);
  std::vector<int64_t> want;
  int64_t want_stale = 0;
  for (const auto& s : original) {
    if (s.sample_id < 5 || s.sample_id >= 35) continue;
    if (s.version_min >= 2) {
      want.push_back(s.sample_id);
    } else {
      ++want_stale;
    }
  }
  ASSERT_GT(want_stale, 0);
  EXPECT_EQ(ids_of(got), want);
  EXPECT_EQ(stale, want_stale);
  EXPECT_EQ(shard.discarded_stale(), want_stale);
  EXPECT_EQ(shard.total_served(), int64_t(want.size()));
  // The stale ones are gone, not left for a later get; the rest of the shard is untouched.
  EXPECT_TRUE(shard.take_range(5, 30).empty());
  EXPECT_EQ(shard.stored(), 10);
}

TEST(QueueProtocol, IdsInShardCountsTheRangeIdsOfEachShard) {
  for (int shards : {1, 2, 3, 5}) {
    for (int64_t first : {0, 1, 7, 12}) {
      for (int64_t count : {0, 1, 2, 4, 9, 16}) {
        for (int shard = 0; shard < shards; ++shard) {
          int64_t brute = 0;
          for (int64_t id = first; id < first + count; ++id)
            brute += queue_protocol::shard_of(id, shards) == shard;
          EXPECT_EQ(queue_protocol::ids_in_shard({first, count}, shard, shards), brute)
              << "shards " << shards << " range [" << first << ", +" << count << ") shard "
              << shard;
        }
      }
    }
  }
}

TEST(QueueProtocol, ShardOfIsSampleIdModShards) {
  EXPECT_EQ(queue_protocol::shard_of(0, 3), 0);
  EXPECT_EQ(queue_protocol::shard_of(7, 3), 1);
  EXPECT_EQ(queue_protocol::shard_of(-1, 3), 2);
  EXPECT_EQ(queue_protocol::shard_of(12345, 1), 0);
}

TEST(QueueProtocol, SplitDemandSumsToTheNeedAndRotatesTheRemainder) {
  for (int64_t need : {0, 1, 5, 12, 13}) {
    for (int k : {1, 2, 3, 5}) {
      for (uint64_t r : {0u, 1u, 4u}) {
        const auto q = queue_protocol::split_demand(need, k, r);
        ASSERT_EQ(int(q.size()), k);
        EXPECT_EQ(std::accumulate(q.begin(), q.end(), int64_t(0)), need);
        for (int64_t x : q) EXPECT_TRUE(x == need / k || x == need / k + 1);
      }
    }
  }
  EXPECT_EQ(queue_protocol::split_demand(2, 3, 1), (std::vector<int64_t>{0, 1, 1}));
  EXPECT_EQ(queue_protocol::split_demand(12, 4, 3), (std::vector<int64_t>{3, 3, 3, 3}));
}

TEST(QueueProtocol, CanonicalOrderIsPromptThenSample) {
  auto batch = test::random_batch(9, 0, 40);
  std::shuffle(batch.begin(), batch.end(), std::mt19937(1));
  batch[0].prompt_id = -5;  // prompt id first, whatever the sample id
  queue_protocol::canonical_sort(batch);
  EXPECT_EQ(batch[0].prompt_id, -5);
  for (size_t i = 1; i < batch.size(); ++i) {
    const auto& a = batch[i - 1];
    const auto& b = batch[i];
    EXPECT_TRUE(a.prompt_id < b.prompt_id ||
                (a.prompt_id == b.prompt_id && a.sample_id < b.sample_id));
  }
}

TEST(QueueProtocol, MessagesRoundTripTheirHeaderAndPayload) {
  queue_protocol::Header h;
  h.shard = 3;
  h.v_min = -2;
  h.count = 17;
  h.request_id = 0x123456789abcull;
  h.accepted = 1;
  const auto batch = test::random_batch(4, 0, 5);
  const auto packed = pack_samples(batch);
  const auto message = queue_protocol::encode(h, packed);
  EXPECT_EQ(message.size(), queue_protocol::kHeaderBytes + packed_bytes(batch));
  const auto back = queue_protocol::decode_header(message);
  EXPECT_EQ(back.shard, 3);
  EXPECT_EQ(back.v_min, -2);
  EXPECT_EQ(back.count, 17);
  EXPECT_EQ(back.request_id, h.request_id);
  EXPECT_EQ(back.accepted, 1u);
  EXPECT_EQ(unpack_samples(queue_protocol::payload_of(message)), batch);
  EXPECT_EQ(queue_protocol::encode(h).size(), queue_protocol::kHeaderBytes);
  EXPECT_THROW(queue_protocol::decode_header(std::span(message.data(), 31)), PackingError);
}

TEST(QueueProtocol, RangeRequestsRoundTripTheirRange) {
  queue_protocol::Header h;
  h.shard = 1;
  h.count = 3;
  const auto message = queue_protocol::encode(h, queue_protocol::encode_range({1234567890123, 9}));
  EXPECT_EQ(message.size(), queue_protocol::kHeaderBytes + queue_protocol::kRangeBytes);
  const auto range = queue_protocol::decode_range(queue_protocol::payload_of(message));
  EXPECT_EQ(range.first, 1234567890123);
  EXPECT_EQ(range.count, 9);
  EXPECT_TRUE(range.contains(1234567890131));
  EXPECT_FALSE(range.contains(1234567890132));
  EXPECT_THROW(queue_protocol::decode_range(queue_protocol::payload_of(message).first(15)),
               PackingError);
  EXPECT_STREQ(queue_protocol::tag_name(queue_protocol::kGetRange), "get-range");
}

}  // namespace
}  // namespace rlf
