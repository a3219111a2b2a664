// A whole file mapped read-only into memory: a file in the page cache is then read in place, with
// no copy into a buffer of our own, by as many threads as want to.
#pragma once

#include <cstddef>
#include <string>

namespace rlf {

class MappedFile {
 public:
  // std::runtime_error naming the file when it cannot be opened or mapped. An empty file maps to
  // no bytes (data() is null).
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const unsigned char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace rlf
