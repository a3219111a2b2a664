// Helpers for MPI tests: world rank and size, verdicts agreed by every rank, counters summed
// over the world, and links over virtual nodes built without a Topology.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/error.h"
#include "mpi_comm/links.h"

namespace rlf::test {

// Deterministic values from integers (a hash), so every rank can build a test's global inputs.
inline uint64_t hash(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t h = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xC2B2AE3D27D4EB4Full ^
               (c + 17) * 0x165667B19E3779F9ull;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return h;
}

inline int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

inline int world_size() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// True when `flag` holds on every rank.
inline bool on_every_rank(bool flag) {
  int mine = flag ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

// Bytes this rank's links counted, both link classes together.
inline uint64_t link_bytes(const Links& links) {
  return links.counters().bytes[0] + links.counters().bytes[1];
}

// The counters of every rank added up (counters are per sender, so this is every message once).
inline LinkCounters world_total(const LinkCounters& mine) {
  LinkCounters total;
  MPI_Allreduce(mine.bytes.data(), total.bytes.data(), 2, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(mine.messages.data(), total.messages.data(), 2, MPI_UINT64_T, MPI_SUM,
                MPI_COMM_WORLD);
  return total;
}

inline std::vector<int> virtual_node_list(int world_size, int ranks_per_node) {
  std::vector<int> node_of(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) node_of[size_t(r)] = r / ranks_per_node;
  return node_of;
}

// Runs `make` on every rank, expects a ConfigError naming `option` on every rank, with the same
// message everywhere (the layout must fail identically before any collective could hang).
inline void expect_config_error_everywhere(const std::function<void()>& make,
                                           const std::string& option) {
  std::string message;
  try {
    make();
  } catch (const ConfigError& error) {
    message = error.what();
  }
  EXPECT_TRUE(on_every_rank(!message.empty())) << "no ConfigError on some rank for " << option;
  EXPECT_NE(message.find(option), std::string::npos) << message;
  uint64_t hash = std::hash<std::string>{}(message), lowest = 0, highest = 0;
  MPI_Allreduce(&hash, &lowest, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&hash, &highest, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(lowest, highest) << "ranks disagree on the message: " << message;
}

}  // namespace rlf::test
