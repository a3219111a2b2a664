#include "src/roles/sample_packing.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

namespace rlf {
namespace {

constexpr uint32_t kMagic = 0x53514C52;  // "RLQS" in little-endian byte order
constexpr uint64_t kChecksumOffset = 24;
constexpr uint64_t kTokenBytes = sizeof(int32_t);
constexpr uint64_t kLogpBytes = sizeof(float);
static_assert(sizeof(float) == 4 && std::numeric_limits<float>::is_iec559);

// 64-bit FNV-1a over 32-bit words in four interleaved lanes (a serial multiply chain would cap
// the hash at about 1 GB/s), folded at the end. Every step is a bijection of its lane's state, so
// any change to a single word always changes the result; it guards against truncation and
// corruption, not against an adversary. Every region hashed is a multiple of 4 bytes.
class Checksum {
 public:
  void add(const std::byte* data, uint64_t bytes) {
    const uint64_t words = bytes / 4;
    for (uint64_t w = 0; w < words; ++w) {
      uint32_t word;
      std::memcpy(&word, data + 4 * w, 4);
      uint64_t& lane = lanes_[next_];
      lane = (lane ^ word) * kPrime;
      next_ = (next_ + 1) & 3;
    }
  }
  uint64_t value() const {
    uint64_t h = kBasis;
    for (uint64_t lane : lanes_) h = (h ^ lane) * kPrime;
    return h;
  }

 private:
  static constexpr uint64_t kBasis = 0xcbf29ce484222325ull;
  static constexpr uint64_t kPrime = 0x100000001b3ull;
  uint64_t lanes_[4] = {kBasis, kBasis ^ 1, kBasis ^ 2, kBasis ^ 3};
  unsigned next_ = 0;
};

template <typename T>
void put(std::byte* at, T value) {
  std::memcpy(at, &value, sizeof(T));
}
template <typename T>
T get(const std::byte* at) {
  T value;
  std::memcpy(&value, at, sizeof(T));
  return value;
}

// memcpy with a null pointer is undefined even for zero bytes, and empty vectors may hold one.
void copy_bytes(void* to, const void* from, uint64_t bytes) {
  if (bytes > 0) std::memcpy(to, from, bytes);
}

uint32_t checked_length(size_t n, const char* what) {
  if (n > std::numeric_limits<uint32_t>::max())
    throw PackingError(std::string("pack_samples: ") + what + " longer than 2^32-1 tokens");
  return uint32_t(n);
}

uint64_t checksum_of(const std::byte* buffer, uint64_t size) {
  Checksum sum;
  sum.add(buffer, kChecksumOffset);
  sum.add(buffer + kPackHeaderBytes, size - kPackHeaderBytes);
  return sum.value();
}

struct Strides {
  uint64_t prompt = 0, response = 0;
};

Strides longest(std::span<const QueueSample> batch) {
  Strides s;
  for (const auto& x : batch) {
    s.prompt = std::max<uint64_t>(s.prompt, x.prompt.size());
    s.response = std::max<uint64_t>(s.response, x.response.size());
  }
  return s;
}

[[noreturn]] void corrupt(const std::string& why) {
  throw PackingError("unpack_samples: corrupt or truncated buffer: " + why);
}

}  // namespace

uint64_t packed_bytes(std::span<const QueueSample> batch) {
  uint64_t tokens = 0, responses = 0;
  for (const auto& x : batch) {
    tokens += x.prompt.size() + x.response.size();
    responses += x.response.size();
  }
  return kPackHeaderBytes + kPackMetadataBytes * batch.size() + kTokenBytes * tokens +
         kLogpBytes * responses;
}

uint64_t padded_bytes(std::span<const QueueSample> batch) {
  const Strides s = longest(batch);
  const uint64_t n = batch.size();
  return kPackHeaderBytes + kPackMetadataBytes * n + kTokenBytes * n * (s.prompt + s.response) +
         kLogpBytes * n * s.response;
}

std::vector<std::byte> pack_samples(std::span<const QueueSample> batch, PackLayout layout) {
  const bool padded = layout == PackLayout::Padded;
  if (!padded && layout != PackLayout::Packed) throw PackingError("pack_samples: unknown layout");
  for (const auto& x : batch) {
    checked_length(x.prompt.size(), "a prompt");
    checked_length(x.response.size(), "a response");
    if (x.behaviour_logp.size() != x.response.size())
      throw PackingError("pack_samples: sample " + std::to_string(x.sample_id) + " has " +
                         std::to_string(x.behaviour_logp.size()) + " log-probs for " +
                         std::to_string(x.response.size()) + " response tokens");
    if (x.version_min > x.version_max)
      throw PackingError("pack_samples: sample " + std::to_string(x.sample_id) +
                         " has version_min > version_max");
  }
  const Strides s = padded ? longest(batch) : Strides{};
  // Zero-initialized, so padding and reserved bytes are zero without a separate fill.
  std::vector<std::byte> buffer(padded ? padded_bytes(batch) : packed_bytes(batch));
  std::byte* out = buffer.data();

  put<uint32_t>(out + 0, kMagic);
  put<uint32_t>(out + 4, uint32_t(layout));
  put<uint64_t>(out + 8, batch.size());
  put<uint32_t>(out + 16, uint32_t(s.prompt));
  put<uint32_t>(out + 20, uint32_t(s.response));

  std::byte* meta = out + kPackHeaderBytes;
  for (const auto& x : batch) {
    put<int64_t>(meta + 0, x.sample_id);
    put<int64_t>(meta + 8, x.prompt_id);
    put<int32_t>(meta + 16, x.group_index);
    put<int32_t>(meta + 20, x.version_min);
    put<int32_t>(meta + 24, x.version_max);
    put<float>(meta + 28, x.reward);
    put<float>(meta + 32, x.advantage);
    put<uint8_t>(meta + 36, uint8_t(x.status));
    put<uint32_t>(meta + 40, uint32_t(x.prompt.size()));
    put<uint32_t>(meta + 44, uint32_t(x.response.size()));
    meta += kPackMetadataBytes;
  }

  std::byte* tokens = meta;
  for (const auto& x : batch) {
    copy_bytes(tokens, x.prompt.data(), kTokenBytes * x.prompt.size());
    tokens += kTokenBytes * (padded ? s.prompt : x.prompt.size());
    copy_bytes(tokens, x.response.data(), kTokenBytes * x.response.size());
    tokens += kTokenBytes * (padded ? s.response : x.response.size());
  }
  std::byte* logp = tokens;
  for (const auto& x : batch) {
    copy_bytes(logp, x.behaviour_logp.data(), kLogpBytes * x.behaviour_logp.size());
    logp += kLogpBytes * (padded ? s.response : x.behaviour_logp.size());
  }

  put<uint64_t>(out + kChecksumOffset, checksum_of(out, buffer.size()));
  return buffer;
}

void unpack_samples_into(std::span<const std::byte> buffer, std::vector<QueueSample>& out) {
  const std::byte* in = buffer.data();
  const uint64_t size = buffer.size();
  if (size < kPackHeaderBytes) corrupt("shorter than the header");
  if (get<uint32_t>(in + 0) != kMagic) corrupt("bad magic");
  const uint32_t layout = get<uint32_t>(in + 4);
  if (layout != uint32_t(PackLayout::Packed) && layout != uint32_t(PackLayout::Padded))
    corrupt("unknown layout " + std::to_string(layout));
  const bool padded = layout == uint32_t(PackLayout::Padded);
  const uint64_t count = get<uint64_t>(in + 8);
  const uint64_t prompt_stride = get<uint32_t>(in + 16);
  const uint64_t response_stride = get<uint32_t>(in + 20);
  if (!padded && (prompt_stride != 0 || response_stride != 0)) corrupt("strides in packed layout");
  if (count > (size - kPackHeaderBytes) / kPackMetadataBytes) corrupt("count exceeds the buffer");

  // The size the lengths imply must be the buffer's size exactly. Every addition is bounded by
  // `size` first, so corrupt lengths cannot overflow the arithmetic.
  const std::byte* meta = in + kPackHeaderBytes;
  uint64_t expected = kPackHeaderBytes + kPackMetadataBytes * count;
  uint64_t longest_prompt = 0, longest_response = 0;
  for (uint64_t i = 0; i < count; ++i) {
    const std::byte* m = meta + kPackMetadataBytes * i;
    const uint64_t p = get<uint32_t>(m + 40), r = get<uint32_t>(m + 44);
    longest_prompt = std::max(longest_prompt, p);
    longest_response = std::max(longest_response, r);
    if (!padded) {
      const uint64_t bytes = kTokenBytes * (p + r) + kLogpBytes * r;  // < 2^36
      if (bytes > size - expected) corrupt("lengths exceed the buffer");
      expected += bytes;
    }
  }
  if (padded) {
    if (longest_prompt != prompt_stride || longest_response != response_stride)
      corrupt("padded strides are not the longest lengths");
    const uint64_t per_sample =
        kTokenBytes * (prompt_stride + response_stride) + kLogpBytes * response_stride;  // < 2^36
    if (count > 0 && per_sample > (size - expected) / count) corrupt("lengths exceed the buffer");
    expected += per_sample * count;
  }
  if (expected != size)
    corrupt("lengths imply " + std::to_string(expected) + " bytes, buffer has " +
            std::to_string(size));
  if (get<uint64_t>(in + kChecksumOffset) != checksum_of(in, size)) corrupt("checksum mismatch");

  std::vector<QueueSample> samples(count);
  for (uint64_t i = 0; i < count; ++i) {
    const std::byte* m = meta + kPackMetadataBytes * i;
    QueueSample& x = samples[i];
    x.sample_id = get<int64_t>(m + 0);
    x.prompt_id = get<int64_t>(m + 8);
    x.group_index = get<int32_t>(m + 16);
    x.version_min = get<int32_t>(m + 20);
    x.version_max = get<int32_t>(m + 24);
    x.reward = get<float>(m + 28);
    x.advantage = get<float>(m + 32);
    const uint8_t status = get<uint8_t>(m + 36);
    if (status > uint8_t(SampleStatus::Partial)) corrupt("unknown sample status");
    x.status = SampleStatus(status);
    if (get<uint8_t>(m + 37) != 0 || get<uint8_t>(m + 38) != 0 || get<uint8_t>(m + 39) != 0)
      corrupt("reserved bytes not zero");
    if (x.version_min > x.version_max) corrupt("version_min > version_max");
    x.prompt.resize(get<uint32_t>(m + 40));
    x.response.resize(get<uint32_t>(m + 44));
    x.behaviour_logp.resize(x.response.size());
  }

  // A padded region must hold zeros past the true length: pack_samples writes nothing else.
  auto padding_is_zero = [](const std::byte* from, uint64_t bytes) {
    return std::all_of(from, from + bytes, [](std::byte b) { return b == std::byte{0}; });
  };
  const std::byte* tokens = meta + kPackMetadataBytes * count;
  for (auto& x : samples) {
    const uint64_t p = kTokenBytes * x.prompt.size(), r = kTokenBytes * x.response.size();
    copy_bytes(x.prompt.data(), tokens, p);
    if (padded && !padding_is_zero(tokens + p, kTokenBytes * prompt_stride - p))
      corrupt("prompt padding not zero");
    tokens += padded ? kTokenBytes * prompt_stride : p;
    copy_bytes(x.response.data(), tokens, r);
    if (padded && !padding_is_zero(tokens + r, kTokenBytes * response_stride - r))
      corrupt("response padding not zero");
    tokens += padded ? kTokenBytes * response_stride : r;
  }
  const std::byte* logp = tokens;
  for (auto& x : samples) {
    const uint64_t l = kLogpBytes * x.behaviour_logp.size();
    copy_bytes(x.behaviour_logp.data(), logp, l);
    if (padded && !padding_is_zero(logp + l, kLogpBytes * response_stride - l))
      corrupt("log-prob padding not zero");
    logp += padded ? kLogpBytes * response_stride : l;
  }

  out.insert(out.end(), std::make_move_iterator(samples.begin()),
             std::make_move_iterator(samples.end()));
}

std::vector<QueueSample> unpack_samples(std::span<const std::byte> buffer) {
  std::vector<QueueSample> samples;
  unpack_samples_into(buffer, samples);
  return samples;
}

}  // namespace rlf
