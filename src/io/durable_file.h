// Files that survive a crash: fsync of a file and of the directory that names it, and small text
// files replaced atomically (temporary name, fsync, rename, fsync of the directory), as
// checkpoints need them; their checksums are in crc32c.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "src/io/crc32c.h"

namespace rlf {

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
