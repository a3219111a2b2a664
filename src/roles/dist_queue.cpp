#include "src/roles/dist_queue.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>

#include "kernels/error.h"
#include "mpi_comm/wait_policy.h"
#include "src/roles/queue_protocol.h"
#include "src/roles/sample_packing.h"

namespace rlf {

namespace qp = queue_protocol;

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::microseconds;

// A put refused for lack of room waits 20 us, 40 us, ... up to 2 ms before it is sent again,
// so a full queue sees a trickle of retries, not a storm.
microseconds retry_delay(int refusals) {
  return microseconds(std::min<int64_t>(int64_t(20) << std::min(refusals - 1, 20), 2000));
}

// Requests a client sends to a server; servers answer with acks and replies.
bool is_request(int tag) {
  return tag == qp::kPut || tag == qp::kGet || tag == qp::kGetRange || tag == qp::kClose;
}
// A leader's scatter to its group is client traffic on both ends, like requests on the way out.
bool sent_by_client(int tag) {
  return is_request(tag) || tag == qp::kScatter;
}

// std::logic_error when a hierarchical get handed this member a sample outside its range.
void check_samples_in_range(const std::vector<QueueSample>& samples, const qp::SampleRange& range,
                            const char* function, const char* rule) {
  for (const QueueSample& s : samples)
    if (!range.contains(s.sample_id))
      throw std::logic_error(std::string("DistQueue::") + function + ": got sample " +
                             std::to_string(s.sample_id) + " for the range [" +
                             std::to_string(range.first) + ", " + std::to_string(range.end()) +
                             "): " + rule);
}

// A range of sample ids names at least one sample, none negative.
void check_range(int64_t first_sample_id, int64_t count, const char* function) {
  if (count < 1 || first_sample_id < 0)
    throw std::invalid_argument(std::string("DistQueue::") + function + ": the sample-id range [" +
                                std::to_string(first_sample_id) + ", " +
                                std::to_string(first_sample_id + count) +
                                ") must hold at least one id, none negative");
}

std::shared_ptr<const std::vector<std::byte>> share(std::vector<std::byte> bytes) {
  return std::make_shared<const std::vector<std::byte>>(std::move(bytes));
}

// The ranks in `to` of ranks `from_ranks` of `from` (same processes, two communicators).
std::vector<int> translate_ranks(MPI_Comm from, const std::vector<int>& from_ranks, MPI_Comm to) {
  MPI_Group from_group, to_group;
  MPI_Comm_group(from, &from_group);
  MPI_Comm_group(to, &to_group);
  std::vector<int> out(from_ranks.size(), MPI_UNDEFINED);
  MPI_Group_translate_ranks(from_group, int(from_ranks.size()), from_ranks.data(), to_group,
                            out.data());
  MPI_Group_free(&from_group);
  MPI_Group_free(&to_group);
  for (int r : out)
    if (r == MPI_UNDEFINED)
      throw std::logic_error("DistQueue: a group member is not in the queue's world");
  return out;
}

}  // namespace

DistQueue::DistQueue(MPI_Comm world, Topology& topology, DistQueueConfig config)
    : config_(config), topology_(topology) {
  if (config.shard_capacity < 1)
    throw ConfigError("the DistQueue shard capacity must be at least 1 sample, got " +
                      std::to_string(config.shard_capacity));
  MPI_Comm_dup(world, &comm_);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  if (size_ != topology.world_size() || rank_ != topology.world_rank())
    throw std::logic_error("DistQueue: `world` is not the communicator the Topology was built on");
  shard_count_ = topology.queue_shards();
  shards_.resize(size_t(shard_count_));
  for (int s = 0; s < shard_count_; ++s) {
    if (topology.queue_server_of_shard(s) != rank_) continue;
    hosted_.push_back(s);
    shards_[size_t(s)] = std::make_unique<QueueShard>(config.shard_capacity);
  }
}

DistQueue::~DistQueue() {
  // Without close() some sends may still be in flight: MPI lets them finish in the background,
  // so their requests are released and their buffers deliberately outlive this object.
  if (!pending_.empty()) {
    static auto* orphans = new std::vector<std::shared_ptr<const std::vector<std::byte>>>;
    for (auto& p : pending_) {
      MPI_Request_free(&p.request);
      orphans->push_back(std::move(p.bytes));
    }
  }
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

const QueueShard& DistQueue::shard(int s) const {
  if (s < 0 || s >= shard_count_ || !shards_[size_t(s)])
    throw std::out_of_range("DistQueue: shard " + std::to_string(s) + " is not hosted here");
  return *shards_[size_t(s)];
}

QueueShard& DistQueue::hosted_shard(int s) {
  return const_cast<QueueShard&>(static_cast<const DistQueue*>(this)->shard(s));
}

// --- messages ---------------------------------------------------------------------------------

void DistQueue::post(int dest, int tag, std::shared_ptr<const std::vector<std::byte>> message) {
  const uint64_t bytes = message->size();
  if (bytes > uint64_t(INT_MAX))
    throw std::length_error("DistQueue: a " + std::string(qp::tag_name(tag)) + " message of " +
                            std::to_string(bytes) +
                            " bytes exceeds MPI's int count; get or put fewer samples at once");
  Traffic& traffic = sent_by_client(tag) ? counters_.client_sent : counters_.server_sent;
  traffic.messages += 1;
  traffic.bytes += bytes;
  if (dest == rank_) {
    counters_.self.messages += 1;
    counters_.self.bytes += bytes;
  } else {
    const TrafficScope queue_traffic(topology_.links(), TrafficKind::RolloutQueue);
    topology_.links().count_send(dest, bytes);
  }
  PendingSend pending{MPI_REQUEST_NULL, std::move(message)};
  MPI_Isend(pending.bytes->data(), int(bytes), MPI_BYTE, dest, tag, comm_, &pending.request);
  pending_.push_back(std::move(pending));
}

std::optional<DistQueue::Message> DistQueue::try_receive(int tag, int source) {
  int found = 0;
  MPI_Message handle;
  MPI_Status status;
  MPI_Improbe(source, tag, comm_, &found, &handle, &status);
  if (!found) return std::nullopt;
  int bytes = 0;
  MPI_Get_count(&status, MPI_BYTE, &bytes);
  Message message{status.MPI_SOURCE, std::vector<std::byte>(size_t(bytes))};
  MPI_Mrecv(message.bytes.data(), bytes, MPI_BYTE, &handle, MPI_STATUS_IGNORE);
  Traffic& traffic = is_request(tag) ? counters_.server_received : counters_.client_received;
  traffic.messages += 1;
  traffic.bytes += uint64_t(bytes);
  // The receiver pays the emulated link delay, as Links::recv does: each message once.
  if (message.source != rank_) topology_.links().emulate(message.source, uint64_t(bytes));
  return message;
}

void DistQueue::progress_sends() {
  for (size_t i = 0; i < pending_.size();) {
    int done = 0;
    MPI_Test(&pending_[i].request, &done, MPI_STATUS_IGNORE);
    if (done) {
      pending_[i] = std::move(pending_.back());
      pending_.pop_back();
    } else {
      ++i;
    }
  }
}

// --- server side ------------------------------------------------------------------------------

void DistQueue::handle_put(const Message& message) {
  const qp::Header h = qp::decode_header(message.bytes);
  QueueShard& shard = hosted_shard(h.shard);
  counters_.put_requests += 1;
  counters_.put_bytes += message.bytes.size();
  auto samples = unpack_samples(qp::payload_of(message.bytes));
  if (int64_t(samples.size()) != h.count)
    throw PackingError("DistQueue: a put announced " + std::to_string(h.count) +
                       " samples and carried " + std::to_string(samples.size()));
  const bool accepted = shard.put(samples);
  if (accepted) {
    counters_.samples_stored += uint64_t(h.count);
  } else {
    counters_.rejected_puts += 1;
  }
  qp::Header ack = h;
  ack.accepted = accepted ? 1 : 0;
  post(message.source, qp::kPutAck, share(qp::encode(ack)));
}

void DistQueue::handle_get(const Message& message) {
  const qp::Header h = qp::decode_header(message.bytes);
  send_reply(message, hosted_shard(h.shard).take(h.count, h.v_min));
}

void DistQueue::handle_get_range(const Message& message) {
  const qp::Header h = qp::decode_header(message.bytes);
  const qp::SampleRange range = qp::decode_range(qp::payload_of(message.bytes));
  int64_t stale = 0;
  const auto samples = hosted_shard(h.shard).take_range(range.first, range.count, h.v_min, &stale);
  counters_.stale_discarded += uint64_t(stale);
  send_reply(message, samples, stale);
}

void DistQueue::send_reply(const Message& message, const std::vector<QueueSample>& samples,
                           int64_t stale) {
  counters_.get_requests += 1;
  counters_.samples_served += samples.size();
  qp::Header reply = qp::decode_header(message.bytes);
  reply.count = int64_t(samples.size());
  reply.stale = uint32_t(stale);
  auto bytes = qp::encode(reply, pack_samples(samples));
  counters_.reply_bytes += bytes.size();
  post(message.source, qp::kGetReply, share(std::move(bytes)));
}

int DistQueue::serve_once() {
  progress_sends();
  int handled = 0;
  // Round robin over the request kinds, so a stream of puts cannot starve gets or closes.
  for (;;) {
    int round = 0;
    if (auto m = try_receive(qp::kPut)) {
      handle_put(*m);
      ++round;
    }
    if (auto m = try_receive(qp::kGet)) {
      handle_get(*m);
      ++round;
    }
    if (auto m = try_receive(qp::kGetRange)) {
      handle_get_range(*m);
      ++round;
    }
    if (try_receive(qp::kClose)) {
      ++counters_.closes;
      ++closes_received_;
      ++round;
    }
    if (round == 0) break;
    handled += round;
  }
  return handled;
}

void DistQueue::serve_until(const std::function<bool()>& done) {
  Backoff idle;
  for (;;) {
    const bool worked = serve_once() > 0;
    if (done()) return;
    idle.step(worked);
  }
}

// --- client side ------------------------------------------------------------------------------

void DistQueue::await_replies(int tag, int wanted, const std::function<void(Message&)>& on_reply) {
  Backoff idle;
  while (wanted > 0) {
    bool worked = serve_once() > 0;
    while (wanted > 0) {
      auto reply = try_receive(tag);
      if (!reply) break;
      on_reply(*reply);
      --wanted;
      worked = true;
    }
    if (wanted > 0) idle.step(worked);
  }
}

void DistQueue::put(std::vector<QueueSample> batch) {
  if (closed_) throw std::logic_error("DistQueue::put after close()");
  std::vector<std::vector<QueueSample>> by_shard(static_cast<size_t>(shard_count_));
  for (auto& x : batch)
    by_shard[size_t(qp::shard_of(x.sample_id, shard_count_))].push_back(std::move(x));

  // One message per run of at most `capacity` samples of a shard: a larger one could never fit.
  struct Chunk {
    int server = 0;
    std::shared_ptr<const std::vector<std::byte>> message;
    int refusals = 0;
    Clock::time_point retry_at{};
    bool in_flight = false, stored = false;
  };
  std::vector<Chunk> chunks;
  std::map<uint64_t, size_t> chunk_of_request;
  for (int s = 0; s < shard_count_; ++s) {
    const auto& samples = by_shard[size_t(s)];
    for (size_t first = 0; first < samples.size(); first += size_t(config_.shard_capacity)) {
      const size_t n = std::min(samples.size() - first, size_t(config_.shard_capacity));
      qp::Header h;
      h.shard = s;
      h.count = int64_t(n);
      h.request_id = next_request_id_++;  // kept across retries: one reply per message in flight
      chunk_of_request[h.request_id] = chunks.size();
      Chunk chunk;
      chunk.server = topology_.queue_server_of_shard(s);
      chunk.message = share(qp::encode(h, pack_samples(std::span(samples).subspan(first, n))));
      chunks.push_back(std::move(chunk));
    }
  }

  size_t unstored = chunks.size();
  Backoff idle;
  while (unstored > 0) {
    bool worked = false;
    const auto now = Clock::now();
    for (auto& c : chunks) {
      if (c.stored || c.in_flight || now < c.retry_at) continue;
      post(c.server, qp::kPut, c.message);
      c.in_flight = true;
      worked = true;
    }
    worked |= serve_once() > 0;
    while (auto reply = try_receive(qp::kPutAck)) {
      const qp::Header h = qp::decode_header(reply->bytes);
      Chunk& c = chunks.at(chunk_of_request.at(h.request_id));
      c.in_flight = false;
      if (h.accepted) {
        c.stored = true;
        --unstored;
      } else {
        c.retry_at = Clock::now() + retry_delay(++c.refusals);
      }
      worked = true;
    }
    if (unstored > 0) idle.step(worked);
  }
}

std::vector<int64_t> DistQueue::ask_round(int tag, int32_t v_min,
                                          std::span<const std::byte> payload,
                                          const std::vector<ShardAsk>& asks,
                                          std::vector<QueueSample>& out,
                                          std::vector<int64_t>* stale) {
  std::map<uint64_t, size_t> ask_of_request;
  for (size_t i = 0; i < asks.size(); ++i) {
    qp::Header h;
    h.shard = asks[i].shard;
    h.v_min = v_min;
    h.count = asks[i].wanted;
    h.request_id = next_request_id_++;
    ask_of_request[h.request_id] = i;
    post(topology_.queue_server_of_shard(h.shard), tag, share(qp::encode(h, payload)));
  }
  counters_.get_rounds += 1;
  std::vector<int64_t> brought(asks.size(), 0);
  if (stale) stale->assign(asks.size(), 0);
  await_replies(qp::kGetReply, int(asks.size()), [&](Message& reply) {
    const qp::Header h = qp::decode_header(reply.bytes);
    const size_t i = ask_of_request.at(h.request_id);
    const size_t before = out.size();
    unpack_samples_into(qp::payload_of(reply.bytes), out);
    const int64_t n = int64_t(out.size() - before);
    if (n != h.count || n > asks[i].wanted)
      throw PackingError("DistQueue: a get reply announced " + std::to_string(h.count) +
                         " samples for " + std::to_string(asks[i].wanted) + " wanted and carried " +
                         std::to_string(n));
    brought[i] = n;
    if (stale) (*stale)[i] = int64_t(h.stale);
  });
  return brought;
}

std::vector<QueueSample> DistQueue::get(int64_t count, int32_t v_min) {
  if (closed_) throw std::logic_error("DistQueue::get after close()");
  std::vector<QueueSample> result;
  if (count <= 0) return result;
  result.reserve(size_t(count));
  // Clients start their rotations at different shards, so remainders spread over the shards.
  uint64_t rotation = uint64_t(rank_) + get_calls_++;
  std::vector<bool> dry(size_t(shard_count_), false);
  Backoff empty;
  int64_t need = count;
  while (need > 0) {
    std::vector<int> ask;
    for (int s = 0; s < shard_count_; ++s)
      if (!dry[size_t(s)]) ask.push_back(s);
    const auto quota = qp::split_demand(need, int(ask.size()), rotation++);
    std::vector<ShardAsk> asks;
    for (size_t i = 0; i < ask.size(); ++i)
      if (quota[i] > 0) asks.push_back({ask[i], quota[i]});
    const auto brought = ask_round(qp::kGet, v_min, {}, asks, result);
    int64_t got = 0;
    for (size_t i = 0; i < asks.size(); ++i) {
      dry[size_t(asks[i].shard)] = brought[i] < asks[i].wanted;
      got += brought[i];
    }
    need -= got;
    if (need > 0 && std::all_of(dry.begin(), dry.end(), [](bool d) { return d; })) {
      std::fill(dry.begin(), dry.end(), false);
      if (got == 0) {
        // Nothing anywhere yet: wait (serving) before asking every shard again.
        empty.step(serve_once() > 0);
        continue;
      }
    }
    if (got > 0) empty.reset();
  }
  qp::canonical_sort(result);
  return result;
}

std::vector<QueueSample> DistQueue::get_range(int64_t first_sample_id, int64_t count,
                                              int32_t v_min) {
  if (closed_) throw std::logic_error("DistQueue::get_range after close()");
  check_range(first_sample_id, count, "get_range");
  const qp::SampleRange range{first_sample_id, count};
  const auto payload = qp::encode_range(range);
  // What each shard still owes: its ids of the range, less what it has returned so far.
  std::vector<int64_t> missing(static_cast<size_t>(shard_count_));
  for (int s = 0; s < shard_count_; ++s)
    missing[size_t(s)] = qp::ids_in_shard(range, s, shard_count_);
  std::vector<QueueSample> result;
  result.reserve(size_t(count));
  Backoff empty;
  for (;;) {
    std::vector<ShardAsk> asks;
    for (int s = 0; s < shard_count_; ++s)
      if (missing[size_t(s)] > 0) asks.push_back({s, missing[size_t(s)]});
    if (asks.empty()) break;
    std::vector<int64_t> stale;
    const auto brought = ask_round(qp::kGetRange, v_min, payload, asks, result, &stale);
    int64_t got = 0;
    for (size_t i = 0; i < asks.size(); ++i) {
      missing[size_t(asks[i].shard)] -= brought[i] + stale[i];
      got += brought[i] + stale[i];
      counters_.stale_skipped += uint64_t(stale[i]);
    }
    // Some ids are not there yet: after a round that brought nothing, wait (serving) first.
    if (got == 0) {
      empty.step(serve_once() > 0);
    } else {
      empty.reset();
    }
  }
  qp::canonical_sort(result);
  return result;
}

std::vector<QueueSample> DistQueue::scatter_from_leader(
    MPI_Comm group, int64_t count_per_member,
    const std::function<std::vector<std::vector<QueueSample>>(int members)>& take_node) {
  int local = 0, members = 0;
  MPI_Comm_rank(group, &local);
  MPI_Comm_size(group, &members);
  if (local == 0) {
    auto parts = take_node(members);
    std::vector<int> member_ranks(static_cast<size_t>(members));
    for (int i = 0; i < members; ++i) member_ranks[size_t(i)] = i;
    const auto dest = translate_ranks(group, member_ranks, comm_);
    for (int i = 1; i < members; ++i) {
      qp::Header h;
      h.count = int64_t(parts[size_t(i)].size());
      // What a range get's shards discarded as too stale (never more than the member's count).
      h.stale = uint32_t(count_per_member - h.count);
      post(dest[size_t(i)], qp::kScatter, share(qp::encode(h, pack_samples(parts[size_t(i)]))));
    }
    return std::move(parts[0]);
  }
  const int leader = translate_ranks(group, {0}, comm_)[0];
  std::vector<QueueSample> mine;
  // The leader may need shards this member hosts before it can scatter: serve while waiting.
  await_replies(qp::kScatter, 1, [&](Message& m) {
    if (m.source != leader) throw std::logic_error("DistQueue: a scatter from a non-leader");
    mine = unpack_samples(qp::payload_of(m.bytes));
    const qp::Header h = qp::decode_header(m.bytes);
    if (int64_t(mine.size()) + int64_t(h.stale) != count_per_member)
      throw PackingError("DistQueue: a scatter carried " + std::to_string(mine.size()) +
                         " samples and " + std::to_string(h.stale) + " stale ids, expected " +
                         std::to_string(count_per_member));
  });
  return mine;
}

std::vector<QueueSample> DistQueue::get_hierarchical(int64_t count_per_member, int32_t v_min,
                                                     const HierarchicalComm& group) {
  if (closed_) throw std::logic_error("DistQueue::get_hierarchical after close()");
  if (count_per_member <= 0) return {};
  return scatter_from_leader(group.intra, count_per_member, [&](int members) {
    auto all = get(count_per_member * members, v_min);
    // Member i takes the i-th run of count_per_member samples in canonical order.
    std::vector<std::vector<QueueSample>> parts(static_cast<size_t>(members));
    for (size_t j = 0; j < all.size(); ++j)
      parts[j / size_t(count_per_member)].push_back(std::move(all[j]));
    return parts;
  });
}

std::vector<QueueSample> DistQueue::get_range_hierarchical(int64_t first_sample_id, int64_t count,
                                                           const HierarchicalComm& group,
                                                           int32_t v_min) {
  if (closed_) throw std::logic_error("DistQueue::get_range_hierarchical after close()");
  check_range(first_sample_id, count, "get_range_hierarchical");
  const qp::SampleRange range{first_sample_id, count};
  auto mine = scatter_from_leader(group.intra, count, [&](int members) {
    // The leader's range comes first and the members' follow it: their union is one range.
    auto all = get_range(first_sample_id, count * members, v_min);
    // Member i takes the ids of its own range; a stable split keeps each part canonical.
    std::vector<std::vector<QueueSample>> parts(static_cast<size_t>(members));
    for (auto& s : all)
      parts[size_t((s.sample_id - first_sample_id) / count)].push_back(std::move(s));
    return parts;
  });
  check_samples_in_range(mine, range, "get_range_hierarchical",
                         "the members' ranges must be consecutive in local-rank order, of equal "
                         "counts");
  return mine;
}

std::vector<QueueSample> DistQueue::get_range_replicated(int64_t first_sample_id, int64_t count,
                                                         const HierarchicalComm& group,
                                                         int32_t v_min) {
  if (closed_) throw std::logic_error("DistQueue::get_range_replicated after close()");
  check_range(first_sample_id, count, "get_range_replicated");
  // One leader for the whole group, wherever its ranks are: the range is taken from the queue
  // once, so a second leader (one per node) would wait for samples already taken.
  auto mine = scatter_from_leader(group.comm, count, [&](int members) {
    return std::vector<std::vector<QueueSample>>(size_t(members),
                                                 get_range(first_sample_id, count, v_min));
  });
  check_samples_in_range(mine, {first_sample_id, count}, "get_range_replicated",
                         "every member must name the same range");
  return mine;
}

// --- collective -------------------------------------------------------------------------------

void DistQueue::barrier() {
  MPI_Request request;
  MPI_Ibarrier(comm_, &request);
  Backoff idle;
  for (;;) {
    const bool worked = serve_once() > 0;
    int done = 0;
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (done) return;
    idle.step(worked);
  }
}

void DistQueue::close() {
  if (closed_) return;
  closed_ = true;
  std::set<int> servers;
  for (int s = 0; s < shard_count_; ++s) servers.insert(topology_.queue_server_of_shard(s));
  for (int server : servers) post(server, qp::kClose, share(qp::encode(qp::Header{})));
  // A server's last request arrives before its sender's Close: every rank closes only after all
  // its own requests were answered.
  const uint64_t expected = is_server() ? uint64_t(size_) : 0;
  Backoff idle;
  for (;;) {
    const bool worked = serve_once() > 0;
    if (closes_received_ >= expected && pending_.empty()) return;
    idle.step(worked);
  }
}

}  // namespace rlf
