// Link classification, exact counters and sleep-based emulation of inter-node links.
#include "mpi_comm/links.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <stdexcept>
#include <thread>

#include "kernels/error.h"
#include "mpi_comm/wait_policy.h"

namespace rlf {

int checked_count(uint64_t bytes, const char* what) {
  if (bytes > uint64_t(INT_MAX)) {
    throw std::length_error(std::string(what) + ": a message of " + std::to_string(bytes) +
                            " bytes exceeds MPI's int count; send it in buckets");
  }
  return int(bytes);
}

namespace {

void sleep_seconds(double seconds) {
  if (seconds > 0) std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

}  // namespace

const char* link_class_name(LinkClass link) {
  return link == LinkClass::IntraNode ? "intra-node" : "inter-node";
}

LinkCounters& LinkCounters::operator+=(const LinkCounters& other) {
  for (size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] += other.bytes[i];
    messages[i] += other.messages[i];
  }
  return *this;
}

double LinkEmulation::delay_seconds(uint64_t bytes) const {
  if (!enabled()) return 0;
  double transfer = inter_node_bandwidth > 0 ? double(bytes) / inter_node_bandwidth : 0;
  return inter_node_latency + transfer;
}

void LinkEmulation::validate() const {
  // Negated comparisons so that NaN fails too.
  if (!(inter_node_bandwidth >= 0) || !std::isfinite(inter_node_bandwidth)) {
    throw ConfigError(
        "--inter-node-bandwidth must be a finite number of bytes per second >= 0 "
        "(0: no bandwidth delay), got " +
        std::to_string(inter_node_bandwidth));
  }
  if (!(inter_node_latency >= 0 && inter_node_latency <= 10)) {
    throw ConfigError(
        "--inter-node-latency must be in [0, 10] seconds (0: no latency delay), "
        "got " +
        std::to_string(inter_node_latency));
  }
}

Links::Links(std::vector<int> node_of_world_rank, LinkEmulation emulation, MPI_Comm world)
    : node_of_(std::move(node_of_world_rank)), world_(world), emulation_(emulation) {
  MPI_Comm_rank(world_, &my_world_rank_);
}

LinkClass Links::classify(int world_rank_a, int world_rank_b) const {
  return node_of(world_rank_a) == node_of(world_rank_b) ? LinkClass::IntraNode
                                                        : LinkClass::InterNode;
}

void Links::count_send(int dest_world_rank, uint64_t bytes) {
  const LinkClass link = classify(my_world_rank_, dest_world_rank);
  counters_.add(link, bytes);
  by_kind_[size_t(kind_)].add(link, bytes);
}

void Links::emulate(int peer_world_rank, uint64_t bytes) const {
  if (classify(my_world_rank_, peer_world_rank) == LinkClass::InterNode) {
    sleep_seconds(emulation_.delay_seconds(bytes));
  }
}

double Links::schedule_arrival(double posted, double seconds) {
  port_free_at_ = std::max(posted, port_free_at_) + seconds;
  return port_free_at_;
}

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int Links::world_rank_of(int rank, MPI_Comm comm) const {
  if (comm == world_) return rank;
  MPI_Group comm_group, world_group;
  MPI_Comm_group(comm, &comm_group);
  MPI_Comm_group(world_, &world_group);
  int world_rank = MPI_UNDEFINED;
  MPI_Group_translate_ranks(comm_group, 1, &rank, world_group, &world_rank);
  MPI_Group_free(&comm_group);
  MPI_Group_free(&world_group);
  if (world_rank == MPI_UNDEFINED) {
    throw std::logic_error("Links: a rank of this communicator is not in the Links' world");
  }
  return world_rank;
}

void Links::send(const void* data, uint64_t bytes, int dest, int tag, MPI_Comm comm) {
  int count = checked_count(bytes, "Links::send");
  count_send(world_rank_of(dest, comm), bytes);
  MPI_Request request;
  MPI_Isend(data, count, MPI_BYTE, dest, tag, comm, &request);
  wait_with_backoff(&request, MPI_STATUS_IGNORE);
}

uint64_t Links::recv(void* data, uint64_t bytes, int source, int tag, MPI_Comm comm) {
  int count = checked_count(bytes, "Links::recv");
  MPI_Request request;
  MPI_Status status;
  MPI_Irecv(data, count, MPI_BYTE, source, tag, comm, &request);
  wait_with_backoff(&request, &status);
  int received = 0;
  MPI_Get_count(&status, MPI_BYTE, &received);
  // The receiver pays the delay, so each message is delayed exactly once.
  emulate(world_rank_of(status.MPI_SOURCE, comm), uint64_t(received));
  return uint64_t(received);
}

void Links::sendrecv(const void* send_data, uint64_t send_bytes, int dest, void* recv_data,
                     uint64_t recv_bytes, int source, int tag, MPI_Comm comm) {
  int send_count = checked_count(send_bytes, "Links::sendrecv");
  int recv_count = checked_count(recv_bytes, "Links::sendrecv");
  count_send(world_rank_of(dest, comm), send_bytes);
  MPI_Request requests[2];
  MPI_Irecv(recv_data, recv_count, MPI_BYTE, source, tag, comm, &requests[0]);
  MPI_Isend(send_data, send_count, MPI_BYTE, dest, tag, comm, &requests[1]);
  MPI_Status status;
  wait_with_backoff(&requests[0], &status);
  wait_with_backoff(&requests[1], MPI_STATUS_IGNORE);
  int received = 0;
  MPI_Get_count(&status, MPI_BYTE, &received);
  emulate(world_rank_of(status.MPI_SOURCE, comm), uint64_t(received));
}

void Backoff::reset() {
  sleep_ = std::chrono::microseconds(1);
  quiet_since_ = steady_seconds();
}

void Backoff::wait() {
  if (steady_seconds() - quiet_since_ < poll_before_sleep_seconds()) {
    std::this_thread::yield();
    return;
  }
  std::this_thread::sleep_for(sleep_);
  sleep_ = std::min(sleep_ * 2, longest_sleep_);
}

void wait_with_backoff(MPI_Request* request, MPI_Status* status,
                       std::chrono::microseconds longest_sleep) {
  int done = 0;
  MPI_Test(request, &done, status);
  Backoff backoff(longest_sleep);
  while (!done) {
    backoff.wait();
    MPI_Test(request, &done, status);
  }
}

}  // namespace rlf
