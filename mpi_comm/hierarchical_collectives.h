// Hierarchical collectives (intra-node step, inter-node step among node leaders, intra-node step)
// and their flat counterparts, built from Links point-to-point messages so that the counters
// hold exactly the bytes each algorithm moves and link emulation delays exactly its inter-node
// messages. Every call is collective over the HierarchicalComm; buffers are processed in buckets
// (at most `bucket_bytes` per step) so large transfers pipeline and stay within MPI's int counts.
//
// Byte model, per bucket of b bytes; P = ranks of the comm, N = nodes, n = ranks on a node:
// - binomial tree (reduce to / broadcast from one rank, m ranks): m - 1 messages of b bytes.
// - ring allreduce (m ranks, m >= 2): the bucket is cut into m chunks (chunk i holds
//   floor(c / m) floats, one more for i < c % m; c = floats in the bucket); rank r sends
//   m - 1 reduce-scatter chunks then m - 1 allgather chunks to rank r + 1 (mod m), 2(m - 1)
//   messages, empty chunks included, in all 2(m - 1) b bytes. Rank r's messages skip chunks
//   r + 1 and r + 2 (mod m), so with m dividing c every rank sends 2 b (m - 1) / m bytes.
// - flat_allreduce_sum: ring over the comm: 2(P - 1) b bytes; those crossing nodes are the ring
//   edges r -> r + 1 between different nodes (N edges when nodes are contiguous and N >= 2).
// - allreduce_sum, nodes of n ranks each (P = N n): the bucket is cut into n shares (as the ring
//   cuts chunks); inside each node a reduce-scatter (local rank r receives share r from each of
//   the other n - 1 ranks, one message each), a ring allreduce of share r among the N ranks of
//   local rank r (the peers), and an allgather of the shares inside the node (n - 1 messages a
//   rank): intra 2(P - N) b bytes in 2 P (n - 1) messages, inter 2(N - 1) b bytes in
//   2 P (N - 1) messages, empty shares included. Every rank's links carry 1 / n of the node's
//   traffic, where a tree through the leader has it carry all of it. (A call of a few bytes pays
//   2 (n - 1) message latencies inside the node against the tree's 2 ceil(log2 n); the callers
//   reduce gradients, megabytes a call, and pack small ranges into one call.)
//   Nodes of different sizes (a group spanning nodes unevenly): binomial reduce inside each
//   node, ring among the N leaders, binomial broadcast inside each node: the same bytes, intra
//   in 2(P - N) messages, inter in 2 N (N - 1).
//   With contiguous nodes of R ranks (P = N R, c divisible by P and N): flat inter
//   2 b (P - 1) / R > hierarchical inter 2 b (N - 1) whenever R >= 2.
// - flat_broadcast: binomial tree over the comm rooted at `root`: P - 1 messages of b.
// - broadcast: binomial tree inside the root's node rooted at the root, binomial tree among the
//   leaders rooted at the root's node leader, binomial tree inside every other node from its
//   leader: P - 1 messages of b, N - 1 of them inter-node.
// - flat_allgather (m ranks, blocks of b_0 .. b_{m-1} bytes): a ring of m - 1 steps; at step s
//   rank r sends block r - s (mod m) to rank r + 1, so it sends every block but block r + 1
//   (mod m): sum(b) - b_{r+1} bytes in m - 1 messages, empty blocks included.
// - gather_bytes / scatter_bytes (inside each node, to/from its leader): per non-leader member,
//   one 8-byte size message, then its payload as one message when it is not empty; all
//   intra-node. Not bucketed.
// Reductions run in a fixed order for a given layout (binomial-tree order inside nodes, also
// where a share's copies are summed on its rank, and ring order among peers or leaders), so
// results are deterministic and identical on every rank; inside one node every element is summed
// in the same order wherever it lies in the buffer.
#pragma once

#include <cstdint>
#include <vector>

#include "mpi_comm/links.h"
#include "mpi_comm/topology.h"

namespace rlf {

inline constexpr uint64_t kDefaultBucketBytes = uint64_t(4) << 20;

// Sum of `data` over all ranks of `h`, in place on every rank.
void allreduce_sum(float* data, int64_t count, const HierarchicalComm& h, Links& links,
                   uint64_t bucket_bytes = kDefaultBucketBytes);
// The same through each node's leader (binomial reduce inside the node, ring among the leaders,
// binomial broadcast): what allreduce_sum runs when the nodes differ in size; inside one node the
// same bits as allreduce_sum. Public for `bench allreduce`, which times the two.
void allreduce_sum_through_leaders(float* data, int64_t count, const HierarchicalComm& h,
                                   Links& links, uint64_t bucket_bytes = kDefaultBucketBytes);
// The same result (up to float reassociation) with a ring over the whole comm, ignoring nodes.
void flat_allreduce_sum(float* data, int64_t count, const HierarchicalComm& h, Links& links,
                        uint64_t bucket_bytes = kDefaultBucketBytes);

// Every rank's block to every rank, in place: block r of `data` is the bytes from offsets[r] up to
// offsets[r + 1] (h.size() + 1 offsets, the same on every rank; blocks may be empty); rank r
// brings block r and ends with all of them. A ring over h.comm, ignoring nodes.
void flat_allgather(void* data, const std::vector<uint64_t>& offsets, const HierarchicalComm& h,
                    Links& links);

// Copies `bytes` bytes at `data` on rank `root` of h.comm into `data` on every rank.
void broadcast(void* data, uint64_t bytes, int root, const HierarchicalComm& h, Links& links,
               uint64_t bucket_bytes = kDefaultBucketBytes);
void flat_broadcast(void* data, uint64_t bytes, int root, const HierarchicalComm& h, Links& links,
                    uint64_t bucket_bytes = kDefaultBucketBytes);

// Every rank's `mine` to its node leader (local rank 0 of h.intra), which gets one buffer per
// rank of h.intra in local-rank order (its own first); other ranks get an empty vector.
std::vector<std::vector<uint8_t>> gather_bytes(const std::vector<uint8_t>& mine,
                                               const HierarchicalComm& h, Links& links);
// The leader's per_member[i] to local rank i of h.intra (per_member must hold one buffer per
// rank of h.intra on the leader; it is ignored elsewhere); returns this rank's buffer.
std::vector<uint8_t> scatter_bytes(const std::vector<std::vector<uint8_t>>& per_member,
                                   const HierarchicalComm& h, Links& links);

}  // namespace rlf
