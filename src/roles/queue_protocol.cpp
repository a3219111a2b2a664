#include "src/roles/queue_protocol.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "src/roles/sample_packing.h"

namespace rlf::queue_protocol {

static_assert(sizeof(Header) == kHeaderBytes, "the header is sent as its bytes");

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

int shard_of(int64_t sample_id, int shards) {
  const int64_t s = sample_id % shards;
  return int(s < 0 ? s + shards : s);
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
