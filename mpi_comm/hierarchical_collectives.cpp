// Hierarchical and flat allreduce, broadcast, gather and scatter from Links point-to-point
// messages (byte model in the header).
#include "mpi_comm/hierarchical_collectives.h"

#include <algorithm>
#include <stdexcept>

namespace rlf {

namespace {

// Distinct tags keep a mismatched call visible as a hang in one collective rather than data
// silently landing in another.
constexpr int kTagReduce = 7101;
constexpr int kTagRing = 7102;
constexpr int kTagBroadcast = 7103;
constexpr int kTagGather = 7104;
constexpr int kTagScatter = 7105;
constexpr int kTagAllgather = 7106;

int rank_in(MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  return rank;
}

int size_of(MPI_Comm comm) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  return size;
}

uint64_t checked_bucket_bytes(uint64_t bucket_bytes) {
  if (bucket_bytes == 0) throw std::invalid_argument("collective bucket size must be > 0");
  return bucket_bytes;
}

// Binomial tree sum to rank 0: rank r adds the partial sums of r + 1, r + 2, r + 4, ... in that
// order, then passes its own up.
void tree_reduce_sum_to_first(float* data, int64_t count, MPI_Comm comm, Links& links,
                              std::vector<float>& scratch) {
  int rank = rank_in(comm), size = size_of(comm);
  uint64_t bytes = uint64_t(count) * sizeof(float);
  scratch.resize(size_t(count));
  for (int mask = 1; mask < size; mask <<= 1) {
    if (rank & mask) {
      links.send(data, bytes, rank - mask, kTagReduce, comm);
      return;
    }
    if (rank + mask < size) {
      links.recv(scratch.data(), bytes, rank + mask, kTagReduce, comm);
      for (int64_t i = 0; i < count; ++i) data[i] += scratch[size_t(i)];
    }
  }
}

// Binomial tree broadcast from `root`, in ranks relative to the root.
void tree_broadcast(void* data, uint64_t bytes, int root, MPI_Comm comm, Links& links) {
  int size = size_of(comm);
  int relative = (rank_in(comm) - root + size) % size;
  int mask = 1;
  for (; mask < size; mask <<= 1) {
    if (relative & mask) {
      links.recv(data, bytes, (relative - mask + root) % size, kTagBroadcast, comm);
      break;
    }
  }
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (relative + mask < size) {
      links.send(data, bytes, (relative + mask + root) % size, kTagBroadcast, comm);
    }
  }
}

// The first float of share `i` when `count` floats are cut into `parts` shares (the first
// count % parts one float longer; share i is [share_begin(i), share_begin(i + 1))): the ring's
// chunks and the node's shares.
int64_t share_begin(int64_t count, int parts, int i) {
  return int64_t(i) * (count / parts) + std::min<int64_t>(i, count % parts);
}

// Ring allreduce: reduce-scatter then allgather, each m - 1 steps to the next rank. Chunk c is
// summed in ring order starting at rank c and then copied, so every rank ends bit-identical.
void ring_allreduce_sum(float* data, int64_t count, MPI_Comm comm, Links& links,
                        std::vector<float>& scratch) {
  int rank = rank_in(comm), size = size_of(comm);
  if (size == 1) return;
  auto chunk_begin = [&](int chunk) { return share_begin(count, size, chunk); };
  auto chunk_length = [&](int chunk) { return chunk_begin(chunk + 1) - chunk_begin(chunk); };
  int next = (rank + 1) % size, previous = (rank - 1 + size) % size;
  scratch.resize(size_t(chunk_length(0)));

  for (int step = 0; step < size - 1; ++step) {
    int send_chunk = (rank - step + size) % size;
    int recv_chunk = (rank - step - 1 + 2 * size) % size;
    int64_t recv_length = chunk_length(recv_chunk);
    links.sendrecv(data + chunk_begin(send_chunk),
                   uint64_t(chunk_length(send_chunk)) * sizeof(float), next, scratch.data(),
                   uint64_t(recv_length) * sizeof(float), previous, kTagRing, comm);
    float* target = data + chunk_begin(recv_chunk);
    for (int64_t i = 0; i < recv_length; ++i) target[i] += scratch[size_t(i)];
  }
  for (int step = 0; step < size - 1; ++step) {
    int send_chunk = (rank + 1 - step + size) % size;
    int recv_chunk = (rank - step + size) % size;
    links.sendrecv(data + chunk_begin(send_chunk),
                   uint64_t(chunk_length(send_chunk)) * sizeof(float), next,
                   data + chunk_begin(recv_chunk),
                   uint64_t(chunk_length(recv_chunk)) * sizeof(float), previous, kTagRing, comm);
  }
}

// Reduce-scatter inside a node: local rank r ends with the node's sum of share r of `data`, summed
// in the binomial tree's order (tree_reduce_sum_to_first: r + 1, then r + 2 .. r + 3, ...), so the
// bits are the tree's. Every rank sends each other rank that rank's share (pairwise steps: to
// r + s, from r - s), n - 1 messages, (n - 1) / n of the data. The other ranks' copies of my share
// land in `scratch`; the tree's last addition writes the sum over my share of `data`.
void node_reduce_scatter(float* data, int64_t count, MPI_Comm intra, Links& links,
                         std::vector<float>& scratch) {
  const int rank = rank_in(intra), size = size_of(intra);
  if (size == 1) return;
  const int64_t first = share_begin(count, size, rank);
  const int64_t length = share_begin(count, size, rank + 1) - first;
  scratch.resize(size_t(length) * size_t(size - 1));
  std::vector<float*> copy_of(static_cast<size_t>(size));  // every rank's copy, in rank order
  for (int r = 0; r < size; ++r) {
    copy_of[size_t(r)] =
        r == rank ? data + first : scratch.data() + int64_t(r < rank ? r : r - 1) * length;
  }
  for (int step = 1; step < size; ++step) {
    const int to = (rank + step) % size, from = (rank - step + size) % size;
    const int64_t to_first = share_begin(count, size, to);
    const int64_t to_length = share_begin(count, size, to + 1) - to_first;
    links.sendrecv(data + to_first, uint64_t(to_length) * sizeof(float), to, copy_of[size_t(from)],
                   uint64_t(length) * sizeof(float), from, kTagReduce, intra);
  }
  // The tree's levels; my own share is no longer sent, so it may hold a partial sum.
  int top = 1;
  while (2 * top < size) top *= 2;
  for (int mask = 1; mask < top; mask <<= 1) {
    for (int r = 0; r + mask < size; r += 2 * mask) {
      float* lower = copy_of[size_t(r)];
      const float* upper = copy_of[size_t(r + mask)];
      for (int64_t i = 0; i < length; ++i) lower[i] += upper[i];
    }
  }
  const float* lower = copy_of[0];
  const float* upper = copy_of[size_t(top)];
  float* out = data + first;
  for (int64_t i = 0; i < length; ++i) out[i] = lower[i] + upper[i];
}

// Allgather inside a node of the shares node_reduce_scatter left: pairwise steps, n - 1 messages.
void node_allgather_shares(float* data, int64_t count, MPI_Comm intra, Links& links) {
  const int rank = rank_in(intra), size = size_of(intra);
  const int64_t first = share_begin(count, size, rank);
  const int64_t length = share_begin(count, size, rank + 1) - first;
  for (int step = 1; step < size; ++step) {
    const int to = (rank + step) % size, from = (rank - step + size) % size;
    const int64_t from_first = share_begin(count, size, from);
    const int64_t from_length = share_begin(count, size, from + 1) - from_first;
    links.sendrecv(data + first, uint64_t(length) * sizeof(float), to, data + from_first,
                   uint64_t(from_length) * sizeof(float), from, kTagAllgather, intra);
  }
}

// Runs `step(offset, length)` over consecutive buckets of at most bucket_bytes / unit elements.
template <typename Step>
void for_each_bucket(uint64_t length, uint64_t unit, uint64_t bucket_bytes, Step step) {
  uint64_t per_bucket = std::max<uint64_t>(1, checked_bucket_bytes(bucket_bytes) / unit);
  for (uint64_t offset = 0; offset < length; offset += per_bucket) {
    step(offset, std::min(per_bucket, length - offset));
  }
}

}  // namespace

void allreduce_sum(float* data, int64_t count, const HierarchicalComm& h, Links& links,
                   uint64_t bucket_bytes) {
  // Nodes of different sizes: through each node's leader.
  if (h.peers == MPI_COMM_NULL)
    return allreduce_sum_through_leaders(data, count, h, links, bucket_bytes);
  std::vector<float> scratch;
  // Equal nodes: every local rank reduces its share of the bucket inside the node, sums it with
  // the same share of the other nodes (a ring among its peers), and gives it back to the node, so
  // every rank's links carry 1 / n of the traffic instead of the leader's carrying all of it.
  const int local_size = size_of(h.intra), local_rank = rank_in(h.intra);
  std::vector<float> ring_scratch;  // one per call, reused by every bucket
  for_each_bucket(uint64_t(count), sizeof(float), bucket_bytes, [&](uint64_t offset, uint64_t n) {
    float* bucket = data + offset;
    node_reduce_scatter(bucket, int64_t(n), h.intra, links, scratch);
    const int64_t first = share_begin(int64_t(n), local_size, local_rank);
    ring_allreduce_sum(bucket + first, share_begin(int64_t(n), local_size, local_rank + 1) - first,
                       h.peers, links, ring_scratch);
    node_allgather_shares(bucket, int64_t(n), h.intra, links);
  });
}

void allreduce_sum_through_leaders(float* data, int64_t count, const HierarchicalComm& h,
                                   Links& links, uint64_t bucket_bytes) {
  std::vector<float> scratch;
  for_each_bucket(uint64_t(count), sizeof(float), bucket_bytes, [&](uint64_t offset, uint64_t n) {
    tree_reduce_sum_to_first(data + offset, int64_t(n), h.intra, links, scratch);
    if (h.leaders != MPI_COMM_NULL) {
      ring_allreduce_sum(data + offset, int64_t(n), h.leaders, links, scratch);
    }
    tree_broadcast(data + offset, n * sizeof(float), 0, h.intra, links);
  });
}

void flat_allreduce_sum(float* data, int64_t count, const HierarchicalComm& h, Links& links,
                        uint64_t bucket_bytes) {
  std::vector<float> scratch;
  for_each_bucket(uint64_t(count), sizeof(float), bucket_bytes, [&](uint64_t offset, uint64_t n) {
    ring_allreduce_sum(data + offset, int64_t(n), h.comm, links, scratch);
  });
}

void flat_allgather(void* data, const std::vector<uint64_t>& offsets, const HierarchicalComm& h,
                    Links& links) {
  const int size = h.size(), rank = h.rank();
  if (int(offsets.size()) != size + 1) {
    throw std::invalid_argument("flat_allgather: one offset per rank and one past the last");
  }
  auto* bytes = static_cast<uint8_t*>(data);
  const int next = (rank + 1) % size, previous = (rank - 1 + size) % size;
  for (int step = 0; step < size - 1; ++step) {
    const int send_block = (rank - step + size) % size;
    const int recv_block = (rank - step - 1 + 2 * size) % size;
    links.sendrecv(bytes + offsets[size_t(send_block)],
                   offsets[size_t(send_block) + 1] - offsets[size_t(send_block)], next,
                   bytes + offsets[size_t(recv_block)],
                   offsets[size_t(recv_block) + 1] - offsets[size_t(recv_block)], previous,
                   kTagAllgather, h.comm);
  }
}

void broadcast(void* data, uint64_t bytes, int root, const HierarchicalComm& h, Links& links,
               uint64_t bucket_bytes) {
  int me = h.rank();
  bool on_root_node = h.leader_index_of[size_t(me)] == h.leader_index_of[size_t(root)];
  int root_local_rank = h.local_rank_of[size_t(root)];
  int root_leader = h.leader_index_of[size_t(root)];
  auto* base = static_cast<uint8_t*>(data);
  // On the root's node the leader receives inside the node before it forwards to the other
  // leaders; elsewhere the leader receives from the leaders' tree first.
  for_each_bucket(bytes, 1, bucket_bytes, [&](uint64_t offset, uint64_t n) {
    if (on_root_node) tree_broadcast(base + offset, n, root_local_rank, h.intra, links);
    if (h.leaders != MPI_COMM_NULL) tree_broadcast(base + offset, n, root_leader, h.leaders, links);
    if (!on_root_node) tree_broadcast(base + offset, n, 0, h.intra, links);
  });
}

void flat_broadcast(void* data, uint64_t bytes, int root, const HierarchicalComm& h, Links& links,
                    uint64_t bucket_bytes) {
  auto* base = static_cast<uint8_t*>(data);
  for_each_bucket(bytes, 1, bucket_bytes, [&](uint64_t offset, uint64_t n) {
    tree_broadcast(base + offset, n, root, h.comm, links);
  });
}

std::vector<std::vector<uint8_t>> gather_bytes(const std::vector<uint8_t>& mine,
                                               const HierarchicalComm& h, Links& links) {
  int local_rank = rank_in(h.intra), members = size_of(h.intra);
  if (local_rank != 0) {
    uint64_t size = mine.size();
    links.send(&size, sizeof size, 0, kTagGather, h.intra);
    if (size > 0) links.send(mine.data(), size, 0, kTagGather, h.intra);
    return {};
  }
  std::vector<std::vector<uint8_t>> gathered(static_cast<size_t>(members));
  gathered[0] = mine;
  for (int member = 1; member < members; ++member) {
    uint64_t size = 0;
    links.recv(&size, sizeof size, member, kTagGather, h.intra);
    gathered[size_t(member)].resize(size);
    if (size > 0) links.recv(gathered[size_t(member)].data(), size, member, kTagGather, h.intra);
  }
  return gathered;
}

std::vector<uint8_t> scatter_bytes(const std::vector<std::vector<uint8_t>>& per_member,
                                   const HierarchicalComm& h, Links& links) {
  int local_rank = rank_in(h.intra), members = size_of(h.intra);
  if (local_rank != 0) {
    uint64_t size = 0;
    links.recv(&size, sizeof size, 0, kTagScatter, h.intra);
    std::vector<uint8_t> mine(size);
    if (size > 0) links.recv(mine.data(), size, 0, kTagScatter, h.intra);
    return mine;
  }
  if (per_member.size() != size_t(members)) {
    throw std::invalid_argument("scatter_bytes: the leader needs one buffer per node member");
  }
  for (int member = 1; member < members; ++member) {
    const auto& buffer = per_member[size_t(member)];
    uint64_t size = buffer.size();
    links.send(&size, sizeof size, member, kTagScatter, h.intra);
    if (size > 0) links.send(buffer.data(), size, member, kTagScatter, h.intra);
  }
  return per_member[0];
}

}  // namespace rlf
