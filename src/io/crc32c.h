// CRC-32C (Castagnoli polynomial 0x1EDC6F41, reflected, initial and final value all ones: the
// checksum of iSCSI, ext4 and Btrfs) of buffers and files, fast enough that verifying a
// checkpoint costs less than reading it. With SSE4.2 (x86-64-v2 and later, so every default
// build) the crc32 instruction runs three independent streams at once (its latency is three
// cycles, its throughput one per cycle), combined by a precomputed linear map; large buffers and
// files are split among threads (oneTBB) and combined the same way. A table otherwise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace rlf {

// `crc` chains calls: crc32c(b, n2, crc32c(a, n1)) == crc32c of a then b.
uint32_t crc32c(const void* data, size_t bytes, uint32_t crc = 0);
// The same value, computed by the threads of the current oneTBB arena in chunks.
uint32_t crc32c_parallel(const void* data, size_t bytes, uint32_t crc = 0);
// The CRC-32C of a whole file (mapped into memory, so a file in the page cache is read in place,
// by several threads); std::runtime_error when it cannot be read.
uint32_t file_crc32c(const std::string& path);

}  // namespace rlf
