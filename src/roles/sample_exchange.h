// Moving samples rank to rank inside a group of data-parallel ranks (data reordering): each
// rank packs the samples bound for each peer with DistQueue's zero-padding packing
// (sample_packing.h), the sizes travel first, then the packed buffers as nonblocking messages,
// counted and emulated by Links like every other transfer.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <vector>

#include "mpi_comm/links.h"
#include "src/roles/queue_sample.h"

namespace rlf {

struct SampleExchangeResult {
  std::vector<QueueSample> received;  // from each source rank of comm in turn, in its order
  uint64_t bytes_sent = 0;            // packed bytes this rank sent to other ranks
  uint64_t bytes_received = 0;        // packed bytes it received from other ranks
};

// Collective over `comm`: samples[i] goes to rank destination[i] of comm (this rank's own stay
// out of the exchange and come back in `received` too, at this rank's turn). Throws
// std::invalid_argument when the sizes differ or a destination is out of range.
SampleExchangeResult exchange_samples(const std::vector<QueueSample>& samples,
                                      const std::vector<int>& destination, MPI_Comm comm,
                                      Links& links);

}  // namespace rlf
