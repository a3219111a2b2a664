#include "src/runtime/expert_migration.h"

#include <algorithm>
#include <stdexcept>

#include "src/model/expert_parallel.h"

namespace rlf {

uint64_t move_expert_slots(const std::vector<int>& old_slot_of, const std::vector<int>& new_slot_of,
                           const ParameterLayout& layout, int local_experts,
                           const std::vector<float*>& buffers, MPI_Comm ep_comm, int layer) {
  for (const std::vector<int>* table : {&old_slot_of, &new_slot_of}) {
    std::vector<int> sorted = *table;
    std::sort(sorted.begin(), sorted.end());
    for (size_t e = 0; e < sorted.size(); ++e) {
      if (sorted.size() != old_slot_of.size() || sorted[e] != int(e)) {
        throw std::invalid_argument(
            "move_expert_slots: a table is not a permutation of the experts");
      }
    }
  }
  int rank = 0;
  MPI_Comm_rank(ep_comm, &rank);
  const int experts = int(old_slot_of.size());
  // Everything leaving this rank is packed before anything lands, so a slot that both sends and
  // receives (a cycle of moves) sends its old expert.
  struct Move {
    int expert;
    std::vector<float> data;
  };
  std::vector<Move> outgoing, incoming;
  std::vector<MPI_Request> requests;
  uint64_t sent = 0;
  for (int e = 0; e < experts; ++e) {
    const int from = old_slot_of[size_t(e)], to = new_slot_of[size_t(e)];
    if (from == to) continue;
    const int source = from / local_experts, target = to / local_experts;
    if (source == rank) {
      const std::vector<ParameterRange> ranges = expert_slices(layout, from, 1, layer);
      Move m{e, {}};
      for (float* buffer : buffers) {
        const std::vector<float> part = pack_ranges(buffer, ranges);
        m.data.insert(m.data.end(), part.begin(), part.end());
      }
      outgoing.push_back(std::move(m));
    }
    if (target == rank) {
      const int64_t count =
          ranges_size(expert_slices(layout, to, 1, layer)) * int64_t(buffers.size());
      incoming.push_back({e, std::vector<float>(static_cast<size_t>(count))});
    }
  }
  requests.reserve(outgoing.size() + incoming.size());
  for (Move& m : incoming) {
    const int source = old_slot_of[size_t(m.expert)] / local_experts;
    if (source == rank) continue;
    requests.emplace_back();
    MPI_Irecv(m.data.data(), int(m.data.size()), MPI_FLOAT, source, m.expert, ep_comm,
              &requests.back());
  }
  for (Move& m : outgoing) {
    const int target = new_slot_of[size_t(m.expert)] / local_experts;
    if (target == rank) {  // a move inside this rank: no message
      for (Move& in : incoming) {
        if (in.expert == m.expert) in.data = m.data;
      }
      continue;
    }
    requests.emplace_back();
    MPI_Isend(m.data.data(), int(m.data.size()), MPI_FLOAT, target, m.expert, ep_comm,
              &requests.back());
    sent += m.data.size() * sizeof(float);
  }
  MPI_Waitall(int(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
  for (const Move& m : incoming) {
    const std::vector<ParameterRange> ranges =
        expert_slices(layout, new_slot_of[size_t(m.expert)], 1, layer);
    const int64_t per_buffer = ranges_size(ranges);
    for (size_t b = 0; b < buffers.size(); ++b) {
      unpack_ranges(m.data.data() + int64_t(b) * per_buffer, ranges, buffers[b]);
    }
  }
  return sent;
}

}  // namespace rlf
