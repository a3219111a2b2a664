// Zero-padding (zero-redundancy) transfer of QueueSample batches: one contiguous byte buffer
// holding every sample at its true length plus a length index, from which the receiver restores
// the samples exactly. A padded layout (every sample padded to the longest in the batch, what a
// padded [batch, max_len] tensor transfer sends) exists only so that benchmarks and tests can
// compare the two on identical data.
//
// Buffer format (host byte order, fields copied with memcpy, so no alignment is assumed):
//
//   header, kPackHeaderBytes = 32
//     u32 magic 'RLQS' | u32 layout (1 packed, 2 padded) | u64 count
//     u32 prompt_stride | u32 response_stride   (padded: longest prompt / response; packed: 0)
//     u64 checksum      (64-bit FNV-1a over the header's first 24 bytes and the whole body)
//   count x metadata, kPackMetadataBytes = 48 each
//     i64 sample_id | i64 prompt_id | i32 group_index | i32 version_min | i32 version_max
//     f32 reward | f32 advantage | u8 status, 3 zero bytes | u32 prompt_len | u32 response_len
//   tokens (i32): for each sample, its prompt then its response
//     (padded: the prompt zero-filled to prompt_stride, the response to response_stride)
//   log-probs (f32): for each sample, its behaviour log-probs
//     (padded: zero-filled to response_stride)
//
// With n samples, prompt lengths P_i, response lengths R_i:
//   packed_bytes = 32 + 48 n + 4 sum_i (P_i + R_i) + 4 sum_i R_i
//   padded_bytes = 32 + 48 n + 4 n (max_i P_i + max_i R_i) + 4 n max_i R_i
// An empty batch is 32 bytes in both layouts; padded_bytes >= packed_bytes always.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <vector>

#include "src/roles/queue_sample.h"

namespace rlf {

// A buffer that is not a complete, intact packed batch (truncated, extended, wrong magic or
// layout, inconsistent lengths, bad checksum), or a sample that cannot be packed.
struct PackingError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class PackLayout : uint32_t { Packed = 1, Padded = 2 };

inline constexpr uint64_t kPackHeaderBytes = 32;
inline constexpr uint64_t kPackMetadataBytes = 48;

// The exact sizes of pack_samples' buffer in each layout (the formulas above).
uint64_t packed_bytes(std::span<const QueueSample> batch);
uint64_t padded_bytes(std::span<const QueueSample> batch);

// Throws PackingError when a sample's log-prob count differs from its response length, its
// version_min exceeds its version_max, or a length does not fit 32 bits.
std::vector<std::byte> pack_samples(std::span<const QueueSample> batch,
                                    PackLayout layout = PackLayout::Packed);

// Restores the batch exactly (either layout; the header says which). Throws PackingError on any
// buffer pack_samples did not produce byte for byte.
std::vector<QueueSample> unpack_samples(std::span<const std::byte> buffer);
// Appends the restored samples to `out` (left unchanged on error), for assembling a batch from
// several buffers.
void unpack_samples_into(std::span<const std::byte> buffer, std::vector<QueueSample>& out);

}  // namespace rlf
