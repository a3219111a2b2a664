// Files that survive a crash: CRC-64 checksums of buffers and files, fsync of a file and of the
// directory that names it, and small text files replaced atomically (temporary name, fsync,
// rename, fsync of the directory), as checkpoints need them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace rlf {

// CRC-64/XZ (ECMA-182 polynomial, reflected, initial and final value all ones); `crc` chains
// calls: crc64(b, n2, crc64(a, n1)) == crc64 of a then b.
uint64_t crc64(const void* data, size_t bytes, uint64_t crc = 0);
// The CRC-64 of a whole file; std::runtime_error when it cannot be read.
uint64_t file_crc64(const std::string& path);

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
