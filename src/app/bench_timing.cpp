#include "src/app/bench_timing.h"

#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

namespace rlf {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double max_over_world(double mine) {
  MPI_Allreduce(MPI_IN_PLACE, &mine, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return mine;
}

uint64_t sum_over_world(uint64_t mine) {
  MPI_Allreduce(MPI_IN_PLACE, &mine, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  return mine;
}

namespace {

std::vector<std::vector<double>> sample_bodies(const std::vector<std::function<void()>>& bodies,
                                               int repeats, bool warm) {
  using Clock = std::chrono::steady_clock;
  std::vector<std::vector<double>> samples(bodies.size());
  for (const auto& body : bodies) body();
  for (int r = 0; r < repeats; ++r) {
    for (size_t i = 0; i < bodies.size(); ++i) {
      if (warm) bodies[i]();
      const auto start = Clock::now();
      bodies[i]();
      samples[i].push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
  }
  return samples;
}

std::vector<double> medians_of(const std::vector<std::vector<double>>& samples) {
  std::vector<double> medians;
  for (const auto& s : samples) medians.push_back(median(s));
  return medians;
}

}  // namespace

std::vector<std::vector<double>> time_interleaved_samples(
    const std::vector<std::function<void()>>& bodies, int repeats) {
  return sample_bodies(bodies, repeats, false);
}

std::vector<double> time_interleaved(const std::vector<std::function<void()>>& bodies,
                                     int repeats) {
  return medians_of(sample_bodies(bodies, repeats, false));
}

std::vector<double> time_interleaved_warm(const std::vector<std::function<void()>>& bodies,
                                          int repeats) {
  return medians_of(sample_bodies(bodies, repeats, true));
}

// The CPUs this rank may run on, e.g. "0" or "0-1".
std::string cpu_list() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return "?";
  std::string out;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &set)) continue;
    int last = c;
    while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, &set)) ++last;
    if (!out.empty()) out += ",";
    out += std::to_string(c);
    if (last > c) {
      out += "-";
      out += std::to_string(last);
    }
    c = last;
  }
  return out;
}

std::string cpu_lists_of_ranks() {
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  char buffer[64] = {};
  std::snprintf(buffer, sizeof buffer, "%s", cpu_list().c_str());
  std::vector<char> all(size_t(size) * sizeof buffer);
  MPI_Gather(buffer, sizeof buffer, MPI_CHAR, all.data(), sizeof buffer, MPI_CHAR, 0,
             MPI_COMM_WORLD);
  std::string out;
  for (int r = 0; rank == 0 && r < size; ++r) {
    // Appended piece by piece: GCC 12's -Wrestrict misfires on `" " + std::string` chains.
    out += ' ';
    out += std::to_string(r);
    out += ":{";
    out += std::string(all.data() + size_t(r) * sizeof buffer);
    out += '}';
  }
  return out;
}

}  // namespace rlf
