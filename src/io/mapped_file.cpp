#include "src/io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <stdexcept>

namespace rlf {

MappedFile::MappedFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error("cannot read '" + path + "'");
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    ::close(fd);
    throw std::runtime_error("cannot read '" + path + "'");
  }
  size_ = size_t(info.st_size);
  if (size_ == 0) {
    ::close(fd);
    return;
  }
  // MAP_POPULATE maps every page of the page cache up front: one call instead of a page fault
  // per few pages while the readers run.
  void* mapped = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
  ::close(fd);  // the mapping keeps the file open
  if (mapped == MAP_FAILED) throw std::runtime_error("cannot map '" + path + "' to read it");
  ::madvise(mapped, size_, MADV_SEQUENTIAL);
  data_ = static_cast<const unsigned char*>(mapped);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<unsigned char*>(data_), size_);
}

}  // namespace rlf
