// Pieces of memory one MPI message carries, in order, as a datatype at their absolute addresses
// (used from MPI_BOTTOM): a message lands straight in (or leaves straight from) parameter slices
// scattered over several buffers, with no staging copy.
#pragma once

#include <mpi.h>

#include <climits>
#include <cstdint>
#include <vector>

namespace rlf {

struct MemoryBlocks {
  std::vector<MPI_Aint> addresses;
  std::vector<int> lengths;
  uint64_t floats = 0;

  void add(const float* data, int64_t count) {
    MPI_Aint address;
    MPI_Get_address(data, &address);
    floats += uint64_t(count);
    // A piece that continues the previous one extends it (consecutive slots, w1 | w3 | w2).
    if (!lengths.empty() &&
        addresses.back() + MPI_Aint(lengths.back()) * MPI_Aint(sizeof(float)) == address &&
        int64_t(lengths.back()) + count <= INT_MAX) {
      lengths.back() += int(count);
      return;
    }
    addresses.push_back(address);
    lengths.push_back(int(count));
  }
  // A committed datatype over the pieces at their absolute addresses (the caller frees it).
  MPI_Datatype type() const {
    MPI_Datatype t;
    MPI_Type_create_hindexed(int(lengths.size()), lengths.data(), addresses.data(), MPI_FLOAT, &t);
    MPI_Type_commit(&t);
    return t;
  }
};

}  // namespace rlf
