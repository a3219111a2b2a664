#include "src/roles/sample_exchange.h"

#include <stdexcept>
#include <string>

#include "src/roles/sample_packing.h"

namespace rlf {

namespace {

constexpr int kSampleExchangeTag = 7301;

}  // namespace

SampleExchangeResult exchange_samples(const std::vector<QueueSample>& samples,
                                      const std::vector<int>& destination, MPI_Comm comm,
                                      Links& links) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  if (destination.size() != samples.size()) {
    throw std::invalid_argument("exchange_samples: " + std::to_string(samples.size()) +
                                " samples and " + std::to_string(destination.size()) +
                                " destinations");
  }
  std::vector<std::vector<QueueSample>> outgoing(static_cast<size_t>(size));
  for (size_t i = 0; i < samples.size(); ++i) {
    if (destination[i] < 0 || destination[i] >= size) {
      throw std::invalid_argument("exchange_samples: destination " +
                                  std::to_string(destination[i]) + " outside the group of " +
                                  std::to_string(size));
    }
    outgoing[size_t(destination[i])].push_back(samples[i]);
  }
  std::vector<std::vector<std::byte>> send(static_cast<size_t>(size));
  std::vector<unsigned long long> send_bytes(size_t(size), 0), recv_bytes(size_t(size), 0);
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank || outgoing[size_t(peer)].empty()) continue;
    send[size_t(peer)] = pack_samples(outgoing[size_t(peer)]);
    send_bytes[size_t(peer)] = send[size_t(peer)].size();
  }
  MPI_Alltoall(send_bytes.data(), 1, MPI_UNSIGNED_LONG_LONG, recv_bytes.data(), 1,
               MPI_UNSIGNED_LONG_LONG, comm);
  SampleExchangeResult result;
  std::vector<std::vector<std::byte>> recv(static_cast<size_t>(size));
  std::vector<MPI_Request> requests;
  for (int peer = 0; peer < size; ++peer) {
    if (recv_bytes[size_t(peer)] == 0) continue;
    recv[size_t(peer)].resize(recv_bytes[size_t(peer)]);
    MPI_Request request;
    MPI_Irecv(recv[size_t(peer)].data(),
              checked_count(recv_bytes[size_t(peer)], "exchange_samples"), MPI_BYTE, peer,
              kSampleExchangeTag, comm, &request);
    requests.push_back(request);
  }
  for (int peer = 0; peer < size; ++peer) {
    if (send_bytes[size_t(peer)] == 0) continue;
    const TrafficScope rollout_traffic(links, TrafficKind::RolloutQueue);
    links.count_send(links.world_rank_of(peer, comm), send_bytes[size_t(peer)]);
    result.bytes_sent += send_bytes[size_t(peer)];
    MPI_Request request;
    MPI_Isend(send[size_t(peer)].data(),
              checked_count(send_bytes[size_t(peer)], "exchange_samples"), MPI_BYTE, peer,
              kSampleExchangeTag, comm, &request);
    requests.push_back(request);
  }
  for (MPI_Request& request : requests) wait_with_backoff(&request, MPI_STATUS_IGNORE);
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) {
      result.received.insert(result.received.end(), outgoing[size_t(peer)].begin(),
                             outgoing[size_t(peer)].end());
      continue;
    }
    if (recv_bytes[size_t(peer)] == 0) continue;
    // The receiver pays the emulated link time, as Links::recv does.
    links.emulate(links.world_rank_of(peer, comm), recv_bytes[size_t(peer)]);
    result.bytes_received += recv_bytes[size_t(peer)];
    unpack_samples_into(recv[size_t(peer)], result.received);
  }
  return result;
}

}  // namespace rlf
