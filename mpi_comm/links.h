// Link classes, exact byte/message counters, and link emulation. Every transfer between two
// world ranks is classified as intra-node or inter-node (real nodes, or virtual nodes of
// --ranks-per-node), counted exactly at the call site, and — when emulation is on — delayed by
// latency + bytes / bandwidth for inter-node links, by sleeping (never spinning), so that
// hierarchical algorithms show their time effect on one machine. Split-phase transfers use the
// delay as a completion deadline instead (schedule_arrival), so it can pass during computation.
#pragma once

#include <mpi.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mpi_comm/routing_log.h"
#include "mpi_comm/traffic_kind.h"

namespace rlf {

enum class LinkClass { IntraNode = 0, InterNode = 1 };
const char* link_class_name(LinkClass link);

struct LinkCounters {
  std::array<uint64_t, 2> bytes{};     // indexed by LinkClass
  std::array<uint64_t, 2> messages{};  // indexed by LinkClass
  void add(LinkClass link, uint64_t byte_count) {
    bytes[size_t(link)] += byte_count;
    messages[size_t(link)] += 1;
  }
  LinkCounters& operator+=(const LinkCounters& other);
};

struct LinkEmulation {
  double inter_node_bandwidth = 0;  // bytes per second; 0: no bandwidth delay
  double inter_node_latency = 0;    // seconds per message; 0: no latency delay
  bool enabled() const { return inter_node_bandwidth > 0 || inter_node_latency > 0; }
  // Seconds an inter-node message of `bytes` takes under emulation (0 when disabled).
  double delay_seconds(uint64_t bytes) const;
  // ConfigError naming --inter-node-bandwidth / --inter-node-latency when out of range.
  void validate() const;
};

// The node of every world rank plus counters and emulation; one per process. "World" is the
// communicator the node list describes (the Topology's world); ranks of any other communicator
// passed to send/recv are translated to it.
class Links {
 public:
  Links(std::vector<int> node_of_world_rank, LinkEmulation emulation,
        MPI_Comm world = MPI_COMM_WORLD);

  LinkClass classify(int world_rank_a, int world_rank_b) const;
  int node_of(int world_rank) const { return node_of_[size_t(world_rank)]; }
  int world_rank() const { return my_world_rank_; }
  const LinkEmulation& emulation() const { return emulation_; }

  // Counts a message this rank sends to `dest_world_rank` (counters are per sender), under the
  // traffic kind in effect (TrafficScope).
  void count_send(int dest_world_rank, uint64_t bytes);
  // Sleeps for the emulated duration of a message between this rank and `peer_world_rank`.
  void emulate(int peer_world_rank, uint64_t bytes) const;
  // Emulation as a completion deadline, for split-phase transfers: a message of `seconds` link
  // time that this rank posts the receive for at `posted` (steady_seconds()) arrives at
  // max(posted, port free) + seconds. A rank's incoming messages share one port, one after
  // another, however many transfers overlap, so overlapping never adds link bandwidth.
  double schedule_arrival(double posted, double seconds);

  // Point-to-point on `comm` with counting and emulation; the wait polls with back-off sleeps
  // (Open MPI busy-polls inside blocking calls, which would steal the peer's core).
  void send(const void* data, uint64_t bytes, int dest, int tag, MPI_Comm comm);
  // Receives at most `bytes`; returns the bytes received. `source` may be MPI_ANY_SOURCE.
  uint64_t recv(void* data, uint64_t bytes, int source, int tag, MPI_Comm comm);
  // Both at once, for exchanges where every rank sends and receives (a ring step): sending
  // first with blocking sends would deadlock once messages exceed the eager limit.
  void sendrecv(const void* send_data, uint64_t send_bytes, int dest, void* recv_data,
                uint64_t recv_bytes, int source, int tag, MPI_Comm comm);

  const LinkCounters& counters() const { return counters_; }
  // The part of counters() sent under `kind`; the kinds' counters sum to counters().
  const LinkCounters& counters(TrafficKind kind) const { return by_kind_[size_t(kind)]; }
  void reset_counters() {
    counters_ = LinkCounters{};
    by_kind_ = {};
  }
  // The kind sends are counted under (TrafficScope sets it).
  TrafficKind traffic_kind() const { return kind_; }

  // The rank of the Links' world that is `rank` of `comm` (for counting nonblocking transfers).
  int world_rank_of(int rank, MPI_Comm comm) const;

  // From now on, the expert dispatchers on these links log their inputs (routing_log.h), so the
  // expert_dispatch bytes these counters hold can be derived from the run's routing.
  void record_routing() {
    if (!routing_log_) routing_log_ = std::make_unique<RoutingLog>();
  }
  RoutingLog* routing_log() { return routing_log_.get(); }  // null unless record_routing()

 private:
  std::vector<int> node_of_;
  MPI_Comm world_;
  LinkEmulation emulation_;
  LinkCounters counters_;
  std::array<LinkCounters, kTrafficKinds> by_kind_{};
  TrafficKind kind_ = TrafficKind::Other;
  int my_world_rank_ = 0;
  double port_free_at_ = 0;  // steady_seconds() when the emulated incoming port is idle again
  std::unique_ptr<RoutingLog> routing_log_;

  friend class TrafficScope;
};

// Counts this rank's sends on `links` under `kind` while it lives; the kind before comes back at
// its end, so the innermost scope names the traffic (the EP dispatcher's inside a pipeline pass
// counts as dispatch). One rank's sends come from one thread.
class TrafficScope {
 public:
  TrafficScope(Links& links, TrafficKind kind) : links_(links), before_(links.kind_) {
    links.kind_ = kind;
  }
  ~TrafficScope() { links_.kind_ = before_; }
  TrafficScope(const TrafficScope&) = delete;
  TrafficScope& operator=(const TrafficScope&) = delete;

 private:
  Links& links_;
  TrafficKind before_;
};

// `bytes` as an MPI count; std::length_error naming `what` when it exceeds an int (a larger
// message must be split into buckets by its caller).
int checked_count(uint64_t bytes, const char* what);

// Seconds on the steady clock: the time base of emulation deadlines.
double steady_seconds();

// Waits for `request` without taking a core for long: MPI_Test polls for
// poll_before_sleep_seconds() (wait_policy.h: without end when every rank has a core of its own),
// yielding between tests, then sleeps that grow from 1 us to `longest_sleep`.
void wait_with_backoff(MPI_Request* request, MPI_Status* status,
                       std::chrono::microseconds longest_sleep = std::chrono::microseconds(1000));

// wait_with_backoff's pacing for a loop that polls several things itself: wait() after a poll
// that found nothing (it yields the core within the poll window, then sleeps for a growing
// time), reset() after one that made progress; step(worked) does either.
class Backoff {
 public:
  explicit Backoff(std::chrono::microseconds longest_sleep = std::chrono::microseconds(1000))
      : longest_sleep_(longest_sleep) {
    reset();
  }
  void reset();
  void wait();
  void step(bool worked) { worked ? reset() : wait(); }

 private:
  std::chrono::microseconds longest_sleep_, sleep_{1};
  double quiet_since_ = 0;
};

}  // namespace rlf
