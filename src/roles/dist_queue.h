// DistQueue: the sharded data queue between RL stages (actors put rollout samples, learners get
// training batches). Shard s is stored on world rank Topology::queue_server_of_shard(s): a
// dedicated queue rank, or a learner that hosts it and serves it between its own steps. Sample x
// goes to shard x.sample_id mod shards. Samples cross the wire packed at their true lengths
// (sample_packing.h); the message protocol is in queue_protocol.h.
//
// Progress model. Every call is non-blocking underneath (MPI_Isend, MPI_Improbe) and every wait
// is a loop that serves this rank's hosted shards and then sleeps with back-off (1 us to 1 ms):
// a rank blocked in put/get/barrier still answers requests for the shards it hosts, so learners
// that host shards and also get from them cannot deadlock, and no wait spins a core.
//
// Life cycle, on every rank of the world: construct (collective), any mix of put / get /
// get_hierarchical / get_range / get_range_hierarchical / get_range_replicated / barrier /
// serve_*, then close()
// (collective): a dedicated queue rank calls close() right away, which serves until every rank
// has closed.
//
// Counting. Messages to other ranks go through Links::count_send (per link class) and pay the
// emulated link delay on receipt, as Links::recv does. Messages a rank sends to itself (a learner
// asking the shard it hosts) cross no link: they are in this queue's counters as self traffic,
// not in Links'.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "mpi_comm/topology.h"
#include "src/roles/queue_sample.h"
#include "src/roles/queue_shard.h"

namespace rlf {

struct DistQueueConfig {
  int64_t shard_capacity = 4096;  // samples per shard (>= 1); a full shard refuses puts
};

struct Traffic {
  uint64_t messages = 0, bytes = 0;
};

struct DistQueueCounters {
  // Server side: what the shards this rank hosts saw.
  uint64_t put_requests = 0;   // Put messages received (a refused put that is retried counts again)
  uint64_t get_requests = 0;   // Get and GetRange messages received
  uint64_t rejected_puts = 0;  // Puts refused because the shard was full (back-pressure)
  uint64_t put_bytes = 0;      // bytes of every Put received, headers included
  uint64_t reply_bytes = 0;    // bytes of every GetReply sent, headers included
  uint64_t samples_stored = 0, samples_served = 0;
  uint64_t closes = 0;
  uint64_t stale_discarded = 0;  // range samples older than the get's v_min, never handed out
  Traffic server_received, server_sent;  // every message to / from the server side
  // Client side (leaders scattering a hierarchical get included).
  Traffic client_sent, client_received;
  uint64_t get_rounds = 0;     // rounds of Get / GetRange requests sent (1 when data was there)
  uint64_t stale_skipped = 0;  // ids of this rank's range gets the shards discarded as too old
  // Every message this rank sent to itself (in the traffic above, not in Links' counters).
  Traffic self;

  uint64_t requests() const { return put_requests + get_requests; }
};

class DistQueue {
 public:
  static constexpr int32_t kAnyVersion = QueueShard::kAnyVersion;

  // Collective over `world`, the communicator `topology` was built on (it is duplicated, so the
  // queue's messages never match anyone else's). ConfigError for a capacity < 1.
  DistQueue(MPI_Comm world, Topology& topology, DistQueueConfig config = {});
  ~DistQueue();
  DistQueue(const DistQueue&) = delete;
  DistQueue& operator=(const DistQueue&) = delete;

  int shards() const { return shard_count_; }
  int64_t shard_capacity() const { return config_.shard_capacity; }
  // Shards stored on this rank, ascending.
  const std::vector<int>& hosted_shards() const { return hosted_; }
  bool is_server() const { return !hosted_.empty(); }
  // A shard this rank hosts (std::out_of_range otherwise).
  const QueueShard& shard(int s) const;

  // --- server side ---
  // Handles every request that has arrived (non-blocking) and progresses this rank's sends;
  // returns the number of messages handled.
  int serve_once();
  // Serves (with back-off sleeps when idle) until done() returns true; done() is checked after
  // every serve_once, so it may look at counters or the clock.
  void serve_until(const std::function<bool()>& done);

  // --- client side ---
  // Stores every sample of `batch` (each in its shard), blocking until all are stored. A shard
  // refuses a message that does not fit whole; the client then retries that message with growing
  // delays (serving meanwhile) until the shard has room: back-pressure never drops a sample.
  // Per shard, the samples travel in messages of at most shard_capacity samples.
  void put(std::vector<QueueSample> batch);
  // Exactly `count` samples with version_min >= v_min, in canonical order (prompt_id, then
  // sample_id), blocking until that many have been put. Each round asks every shard still
  // believed to hold samples for an even share of what is missing, all requests in flight at
  // once; a shard that returns less than its share is skipped until every shard has come up short
  // (then all are asked again, after a back-off wait when the round brought nothing).
  std::vector<QueueSample> get(int64_t count, int32_t v_min = kAnyVersion);
  // Hierarchical get, collective over group.intra: only the node leader (local rank 0) asks the
  // queue, for count_per_member x members samples, and hands local rank i the i-th run of
  // count_per_member of them in canonical order (one Scatter message per member, counted by
  // Links as intra-node traffic). Every member returns its share in canonical order. The queue
  // sees 1/members of the requests of `members` flat gets. Not scatter_bytes (hierarchical_
  // collectives.h): its blocking sends and receives stop serving, and a member that hosts a
  // shard the leader is reading from would deadlock the group.
  std::vector<QueueSample> get_hierarchical(int64_t count_per_member, int32_t v_min,
                                            const HierarchicalComm& group);
  // Exactly the samples with ids [first_sample_id, first_sample_id + count), any version, in
  // canonical order, blocking until every one of them has been put. Which samples a caller gets
  // depends on the ids alone, never on timing: the synchronous trainer splits each step's batch
  // among learners this way, so that a seed fixes the result bit for bit. Each shard is asked
  // only for the ids it holds; each round asks every shard still missing some, all requests in
  // flight at once, and a round that brought nothing is followed by a back-off wait (serving)
  // before the next. std::invalid_argument for count < 1 or a negative first id.
  // StaleSync's bound in the transport: a sample of the range with version_min < v_min is never
  // handed out; its shard discards it, and the call returns without it (counted in
  // counters().stale_skipped here and stale_discarded at the shard's server).
  std::vector<QueueSample> get_range(int64_t first_sample_id, int64_t count,
                                     int32_t v_min = kAnyVersion);
  // Hierarchical get_range, collective over group.intra: every member names its own range, and
  // the members' ranges must be consecutive in local-rank order with equal counts (as learners'
  // ranges are: learners are node-contiguous). Only the node leader asks the queue, for the
  // union of the ranges, and sends local rank i its range (one Scatter message per member); the
  // queue sees 1/members of the requests of `members` flat get_range calls. A member whose
  // scattered samples fall outside its range throws std::logic_error (ranges not consecutive).
  std::vector<QueueSample> get_range_hierarchical(int64_t first_sample_id, int64_t count,
                                                  const HierarchicalComm& group,
                                                  int32_t v_min = kAnyVersion);
  // One get_range for a group whose every member trains the same samples (a tensor-parallel
  // group: TensorParallel::group(); a pipeline or a model replica, which may span nodes),
  // collective over group.comm: every member names the same range; only the leader (the group's
  // rank 0) asks the queue for it and sends every member the same samples (one Scatter message
  // each, inter-node for members on other nodes). The queue sees 1/members of the requests and
  // bytes of each member fetching its own copy. A member whose samples fall
  // outside its range throws std::logic_error (members named different ranges).
  std::vector<QueueSample> get_range_replicated(int64_t first_sample_id, int64_t count,
                                                const HierarchicalComm& group,
                                                int32_t v_min = kAnyVersion);

  // --- collective ---
  // MPI barrier over the world that keeps serving while it waits.
  void barrier();
  // Tells every server this rank will send no more requests, then serves until every rank of the
  // world has said the same and this rank's sends have completed. No queue call after it.
  void close();

  const DistQueueCounters& counters() const { return counters_; }
  void reset_counters() { counters_ = DistQueueCounters{}; }

 private:
  struct Message {
    int source = -1;
    std::vector<std::byte> bytes;
  };
  struct PendingSend {
    MPI_Request request;
    std::shared_ptr<const std::vector<std::byte>> bytes;
  };
  struct ShardAsk {  // one shard's request in a round of a get
    int shard = 0;
    int64_t wanted = 0;
  };

  void post(int dest, int tag, std::shared_ptr<const std::vector<std::byte>> message);
  std::optional<Message> try_receive(int tag, int source = MPI_ANY_SOURCE);
  void progress_sends();
  void handle_put(const Message& message);
  void handle_get(const Message& message);
  void handle_get_range(const Message& message);
  // Answers a get or get-range: `samples` taken from shard h.shard go back in one GetReply.
  void send_reply(const Message& message, const std::vector<QueueSample>& samples,
                  int64_t stale = 0);
  QueueShard& hosted_shard(int s);
  // Serves until `wanted` replies with `tag` have arrived, passing each to on_reply.
  void await_replies(int tag, int wanted, const std::function<void(Message&)>& on_reply);
  // One round of a get: a request with `tag` to each asked shard, all in flight at once (header
  // {shard, v_min, count = wanted}, then `payload`); serves until every GetReply is in and
  // appends the samples to `out`. Returns how many samples each ask brought, in ask order.
  // With `stale`, also how many ids each ask's shard discarded as older than v_min (GetRange).
  std::vector<int64_t> ask_round(int tag, int32_t v_min, std::span<const std::byte> payload,
                                 const std::vector<ShardAsk>& asks, std::vector<QueueSample>& out,
                                 std::vector<int64_t>* stale = nullptr);
  // The half the leader gets share, collective over `group` (a node's ranks, or a whole
  // replicated group): the leader (its rank 0) gets the samples from take_node(members), one part
  // per member, keeps part 0 and sends part i to rank i; a member serves until its part of
  // count_per_member samples arrives.
  std::vector<QueueSample> scatter_from_leader(
      MPI_Comm group, int64_t count_per_member,
      const std::function<std::vector<std::vector<QueueSample>>(int members)>& take_node);

  DistQueueConfig config_;
  Topology& topology_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 0, shard_count_ = 0;
  std::vector<int> hosted_;
  std::vector<std::unique_ptr<QueueShard>> shards_;  // indexed by shard; null when not hosted
  std::vector<PendingSend> pending_;
  uint64_t next_request_id_ = 1;
  uint64_t get_calls_ = 0;
  uint64_t closes_received_ = 0;  // not in counters_: reset_counters() must not forget a close
  bool closed_ = false;
  DistQueueCounters counters_;
};

}  // namespace rlf
