// Timing for benchmarks: bodies run interleaved (A B A B ...) after one warm-up each, and each
// reports the median of its repeats, so slow drift of the machine hits all sides alike.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace rlf {

double median(std::vector<double> values);
// The largest / the sum of every rank's value over MPI_COMM_WORLD (collective), for the tables'
// slowest-rank times and all-rank counts.
double max_over_world(double mine);
uint64_t sum_over_world(uint64_t mine);
// Returns each body's median wall time in seconds.
std::vector<double> time_interleaved(const std::vector<std::function<void()>>& bodies, int repeats);
// The same runs, every repeat's wall time of each body (in the order run).
std::vector<std::vector<double>> time_interleaved_samples(
    const std::vector<std::function<void()>>& bodies, int repeats);
// The same, each timed run right after an untimed run of the same body: the body's data is as
// warm in the caches as when the runtime repeats it back to back (generation's decode steps of one
// model), where time_interleaved's runs follow the other bodies' (which may evict it).
std::vector<double> time_interleaved_warm(const std::vector<std::function<void()>>& bodies,
                                          int repeats);
// The CPUs this process may run on, e.g. "0" or "0-1" ("?" when unknown).
std::string cpu_list();
// Every rank's cpu_list() on rank 0 of MPI_COMM_WORLD as " 0:{0} 1:{1}" (collective; empty on
// the other ranks).
std::string cpu_lists_of_ranks();

}  // namespace rlf
