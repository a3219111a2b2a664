#include "src/runtime/posted_sends.h"

#include <iterator>
#include <utility>

namespace rlf {

void PostedSends::post(int to, std::vector<char> message) {
  links_.count_send(links_.world_rank_of(to, comm_), message.size());
  pending_.push_back({std::move(message), MPI_REQUEST_NULL});
  Pending& p = pending_.back();
  MPI_Isend(p.bytes.data(), checked_count(p.bytes.size(), "PostedSends::post"), MPI_BYTE, to, tag_,
            comm_, &p.request);
  for (auto it = pending_.begin(); it != pending_.end();) {
    int done = 0;
    MPI_Test(&it->request, &done, MPI_STATUS_IGNORE);
    it = done ? pending_.erase(it) : std::next(it);
  }
}

void PostedSends::finish() {
  for (Pending& p : pending_) wait_with_backoff(&p.request, MPI_STATUS_IGNORE);
  pending_.clear();
}

}  // namespace rlf
