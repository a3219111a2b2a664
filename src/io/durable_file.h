// Files that survive a crash: CRC-32C checksums of buffers and files, fsync of a file and of the
// directory that names it, and small text files replaced atomically (temporary name, fsync,
// rename, fsync of the directory), as checkpoints need them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace rlf {

// CRC-32C (Castagnoli polynomial 0x1EDC6F41, reflected, initial and final value all ones: the
// checksum of iSCSI, ext4 and Btrfs). Computed with the SSE4.2 crc32 instruction where the build
// targets it (x86-64-v2 and later, so every default build), ~4 GB/s per core against ~1 GB/s
// for a table-driven CRC-64, which made checksums most of a checkpoint's write time; a table
// otherwise. `crc` chains calls: crc32c(b, n2, crc32c(a, n1)) == crc32c of a then b.
uint32_t crc32c(const void* data, size_t bytes, uint32_t crc = 0);
// The CRC-32C of a whole file; std::runtime_error when it cannot be read.
uint32_t file_crc32c(const std::string& path);

// Flushes the file's data (or the directory's entries) to stable storage.
void fsync_path(const std::string& path);
// Renames `from` to `to` and fsyncs the directory of `to`, so the new name is durable.
void durable_rename(const std::string& from, const std::string& to);
// Writes `text` to `path + ".tmp"`, fsyncs it, and renames it over `path` durably: a reader sees
// the old or the new content, never a mix.
void write_text_atomically(const std::string& path, const std::string& text);
// The whole content of a small text file ("" when it cannot be read).
std::string read_text(const std::string& path);

}  // namespace rlf
