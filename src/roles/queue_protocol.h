// DistQueue's wire protocol and the pure rules both sides share: message tags, the fixed message
// header, which shard a sample belongs to, how a get spreads its demand over shards, which ids of
// a range a shard holds, and the canonical order of an assembled batch. No MPI here, so every
// rule has a unit test.
//
// Every message is a 32-byte header, followed for Put, GetReply and Scatter by one
// pack_samples() buffer (packed layout) and for GetRange by a 16-byte SampleRange:
//   Put       client -> server   {shard, count = samples, request_id} + packed samples
//   PutAck    server -> client   {shard, count, request_id, accepted = 1 stored | 0 shard full}
//   Get       client -> server   {shard, v_min, count = most samples wanted, request_id}
//   GetRange  client -> server   {shard, v_min, count = ids of the range still missing from this
//                                 shard, request_id} + SampleRange {first sample id, ids}
//   GetReply  server -> client   {shard, count = samples returned, request_id, stale = ids of a
//                                 GetRange discarded as older than its v_min} + packed samples
//   Close     any rank -> server {} (the sender will send no more requests)
//   Scatter   leader -> member   {count} + packed samples (hierarchical get)
// A GetRange is answered by a GetReply with every sample of the range the shard holds now (maybe
// none: the client asks again later). So a put of batch B costs 32 + packed_bytes(B) bytes one
// way and 32 back; a get that returns B costs 32 + 32 + packed_bytes(B); a get by range that
// returns B costs 48 + 32 + packed_bytes(B).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "src/roles/queue_sample.h"

namespace rlf::queue_protocol {

// Tags on DistQueue's private communicator (a duplicate of the world, so no other traffic
// matches them).
enum Tag : int {
  kPut = 1,
  kPutAck = 2,
  kGet = 3,
  kGetReply = 4,
  kClose = 5,
  kScatter = 6,
  kGetRange = 7
};
const char* tag_name(int tag);

struct Header {
  int32_t shard = -1;
  int32_t v_min = 0;
  int64_t count = 0;
  uint64_t request_id = 0;
  uint32_t accepted = 0;
  uint32_t stale = 0;  // GetReply to a GetRange: samples discarded by StaleSync's bound
};
inline constexpr uint64_t kHeaderBytes = 32;

// The sample ids [first, first + count): what a deterministic get asks for. Ids, not positions in
// arrival order, so that which samples a learner trains on never depends on timing.
struct SampleRange {
  int64_t first = 0;
  int64_t count = 0;
  int64_t end() const { return first + count; }
  bool contains(int64_t sample_id) const { return sample_id >= first && sample_id < end(); }
};
inline constexpr uint64_t kRangeBytes = 16;
// The payload of a GetRange message; decode_range throws PackingError unless it is exactly that.
std::vector<std::byte> encode_range(const SampleRange& range);
SampleRange decode_range(std::span<const std::byte> payload);

// Header followed by `payload`, in one buffer ready to send.
std::vector<std::byte> encode(const Header& header, std::span<const std::byte> payload = {});
// The header of a received message (PackingError when shorter than a header).
Header decode_header(std::span<const std::byte> message);
// What follows the header.
std::span<const std::byte> payload_of(std::span<const std::byte> message);

// The shard of a sample: sample_id mod shards, non-negative for negative ids too.
int shard_of(int64_t sample_id, int shards);
// How many ids of `range` belong to `shard` (of `shards`): the samples a GetRange to that shard
// must eventually return.
int64_t ids_in_shard(const SampleRange& range, int shard, int shards);

// How many samples to ask each of `ask` shards for when `need` are wanted: need / k each, and the
// remainder one each starting at ask[rotation % k], so that repeated gets spread their
// remainders. Returns one quota per entry of `ask` (zeros allowed; the caller skips them).
std::vector<int64_t> split_demand(int64_t need, int ask_count, uint64_t rotation);

// Sorts by (prompt_id, sample_id): the order a learner sees, whatever order samples arrived in.
void canonical_sort(std::vector<QueueSample>& samples);

}  // namespace rlf::queue_protocol
