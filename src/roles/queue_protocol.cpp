#include "src/roles/queue_protocol.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "src/roles/sample_packing.h"

namespace rlf::queue_protocol {

static_assert(sizeof(Header) == kHeaderBytes, "the header is sent as its bytes");
static_assert(sizeof(SampleRange) == kRangeBytes, "a range is sent as its bytes");

const char* tag_name(int tag) {
  switch (tag) {
    case kPut:
      return "put";
    case kPutAck:
      return "put-ack";
    case kGet:
      return "get";
    case kGetReply:
      return "get-reply";
    case kClose:
      return "close";
    case kScatter:
      return "scatter";
    case kGetRange:
      return "get-range";
  }
  return "unknown";
}

std::vector<std::byte> encode(const Header& header, std::span<const std::byte> payload) {
  std::vector<std::byte> message(kHeaderBytes + payload.size());
  std::memcpy(message.data(), &header, kHeaderBytes);
  if (!payload.empty()) std::memcpy(message.data() + kHeaderBytes, payload.data(), payload.size());
  return message;
}

Header decode_header(std::span<const std::byte> message) {
  if (message.size() < kHeaderBytes)
    throw PackingError("DistQueue message of " + std::to_string(message.size()) +
                       " bytes is shorter than its header");
  Header header;
  std::memcpy(&header, message.data(), kHeaderBytes);
  return header;
}

std::span<const std::byte> payload_of(std::span<const std::byte> message) {
  return message.subspan(kHeaderBytes);
}

std::vector<std::byte> encode_range(const SampleRange& range) {
  std::vector<std::byte> bytes(kRangeBytes);
  std::memcpy(bytes.data(), &range, kRangeBytes);
  return bytes;
}

SampleRange decode_range(std::span<const std::byte> payload) {
  if (payload.size() != kRangeBytes)
    throw PackingError("a DistQueue get-range request carries " + std::to_string(payload.size()) +
                       " bytes after its header, expected " + std::to_string(kRangeBytes));
  SampleRange range;
  std::memcpy(&range, payload.data(), kRangeBytes);
  return range;
}

int shard_of(int64_t sample_id, int shards) {
  const int64_t s = sample_id % shards;
  return int(s < 0 ? s + shards : s);
}

int64_t ids_in_shard(const SampleRange& range, int shard, int shards) {
  if (range.count <= 0) return 0;
  // The first id of the range in this shard, then every shards-th id up to the end.
  const int64_t first = range.first + (shard - shard_of(range.first, shards) + shards) % shards;
  return first < range.end() ? (range.end() - 1 - first) / shards + 1 : 0;
}

std::vector<int64_t> split_demand(int64_t need, int ask_count, uint64_t rotation) {
  std::vector<int64_t> quota(size_t(ask_count), need / ask_count);
  const int64_t remainder = need % ask_count;
  for (int64_t i = 0; i < remainder; ++i) quota[(rotation + uint64_t(i)) % uint64_t(ask_count)]++;
  return quota;
}

void canonical_sort(std::vector<QueueSample>& samples) {
  std::sort(samples.begin(), samples.end(), [](const QueueSample& a, const QueueSample& b) {
    return a.prompt_id != b.prompt_id ? a.prompt_id < b.prompt_id : a.sample_id < b.sample_id;
  });
}

}  // namespace rlf::queue_protocol
