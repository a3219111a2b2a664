#include "src/runtime/role_expert_parallel.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>
#include <stdexcept>
#include <string>

#include "kernels/error.h"
#include "src/model/expert_parallel.h"
#include "src/runtime/expert_migration.h"
#include "src/runtime/expert_replicas.h"

namespace rlf {

namespace {

uint64_t bytes_sent(const LinkCounters& c) {
  return c.bytes[0] + c.bytes[1];
}

// Each expert's first replica (lowest slot) in a slot -> expert table.
std::vector<int> first_replicas(const std::vector<int>& slot_expert, int experts) {
  std::vector<int> slot_of(size_t(experts), -1);
  for (size_t s = slot_expert.size(); s-- > 0;) slot_of[size_t(slot_expert[s])] = int(s);
  return slot_of;
}

// Routes `dispatcher` (an ExpertDispatcher or every chunk of an OverlappedExperts) by a layer's
// tables: the permutation without redundant slots (the rebalancer's migrations), else the expert
// in every slot.
template <typename Dispatcher>
void route_by_tables(Dispatcher& dispatcher, int redundant_slots, const std::vector<int>& slot_of,
                     const std::vector<int>& slot_expert) {
  if (redundant_slots == 0) {
    dispatcher.set_expert_slots(slot_of);
  } else {
    dispatcher.set_slot_experts(slot_expert);
  }
}

}  // namespace

void validate_role_expert_parallel(const char* what, int degree,
                                   const std::vector<int>& role_world_ranks, int experts,
                                   DispatchMode mode, const Links& links, const char* role) {
  const int ranks = int(role_world_ranks.size());
  if (degree < 1 || ranks % degree != 0 || experts % degree != 0) {
    throw ConfigError(std::string(what) + " must be >= 1 and divide both the " +
                      std::to_string(ranks) + " " + role + " rank(s) and the model's " +
                      std::to_string(experts) + " experts, got " + std::to_string(degree));
  }
  if (mode != DispatchMode::Hierarchical) return;
  for (int first = 0; first < ranks; first += degree) {
    std::map<int, int> ranks_on_node;
    for (int i = first; i < first + degree; ++i)
      ++ranks_on_node[links.node_of(role_world_ranks[size_t(i)])];
    for (const auto& [node, count] : ranks_on_node) {
      if (count != ranks_on_node.begin()->second) {
        throw ConfigError(std::string(what) + " " + std::to_string(degree) +
                          ": hierarchical dispatch needs the same number of " + role +
                          " ranks of an EP group on each of its nodes (choose --ranks-per-node "
                          "or the degree so groups split evenly, or --ep-dispatch flat-dedup)");
      }
    }
  }
}

RoleExpertParallel::RoleExpertParallel(const HierarchicalComm& role, Links& links, int experts,
                                       int degree, DispatchMode mode, int redundant_slots)
    : role_(role),
      links_(links),
      experts_(experts),
      degree_(degree),
      redundant_(redundant_slots),
      mode_(mode) {
  const int role_rank = role.rank();
  ep_rank_ = role_rank % degree;
  replica_ = role_rank / degree;
  MPI_Comm group, data_group;
  MPI_Comm_split(role.comm, replica_, role_rank, &group);
  MPI_Comm_split(role.comm, ep_rank_, role_rank, &data_group);
  ep_group_ = make_hierarchical(group, links);
  expert_data_group_ = make_hierarchical(data_group, links);
  MPI_Comm_free(&group);
  MPI_Comm_free(&data_group);
}

RoleExpertParallel::~RoleExpertParallel() {
  overlapped_.clear();
  dispatchers_.clear();
  free_hierarchical(expert_data_group_);
  free_hierarchical(ep_group_);
}

void RoleExpertParallel::ensure_tables(int layers) {
  if (!slot_expert_.empty()) return;
  slot_expert_.assign(size_t(layers), default_slot_experts(experts_, degree_, redundant_));
  slot_of_.assign(size_t(layers), first_replicas(slot_expert_.front(), experts_));
}

std::vector<std::vector<ParameterRange>> RoleExpertParallel::slot_ranges(
    const ParameterLayout& layout) const {
  std::vector<std::vector<ParameterRange>> ranges;
  const int local = local_slots();
  // Every layer with a table (a pipeline stage's layout stores only some: the others' ranges are
  // empty).
  const int layers = std::max(expert_layers(layout), int(slot_expert_.size()));
  for (int l = 0; l < layers; ++l)
    for (int i = 0; i < local; ++i)
      ranges.push_back(expert_slices(layout, ep_rank_ * local + i, 1, l));
  return ranges;
}

std::unique_ptr<ExpertDispatcher> RoleExpertParallel::make_dispatcher(int layer) {
  auto d = std::make_unique<ExpertDispatcher>(ep_group_, links_, experts_, mode_, 0.0, redundant_);
  route_by_tables(*d, redundant_, slot_of_[size_t(layer)], slot_expert_[size_t(layer)]);
  return d;
}

void RoleExpertParallel::attach(Transformer<float>& model, int overlap_chunks) {
  const ModelConfig& config = model.config();
  ensure_tables(config.n_layers);
  model.set_expert_parallel(make_dispatcher_set(config.n_layers));
  if (overlap_chunks <= 1) return;
  model.set_expert_overlap(make_overlap_set(config, overlap_chunks, model.ops(), model.device()));
}

std::vector<OverlappedExperts*> RoleExpertParallel::make_overlap_set(const ModelConfig& config,
                                                                     int chunks,
                                                                     const Ops<float>& ops,
                                                                     Arena& scratch) {
  std::vector<OverlappedExperts*> set;
  for (int l = 0; l < config.n_layers; ++l) {
    overlapped_.push_back(std::make_unique<OverlappedExperts>(ep_group_, links_, experts_, mode_,
                                                              chunks, config.d_model, config.d_ff,
                                                              ops, scratch, 0.0, redundant_));
    route_by_tables(*overlapped_.back(), redundant_, slot_of_[size_t(l)], slot_expert_[size_t(l)]);
    set.push_back(overlapped_.back().get());
  }
  return set;
}

std::vector<OverlappedExperts*> RoleExpertParallel::make_view_overlap(const ModelConfig& config,
                                                                      int chunks,
                                                                      const Ops<float>& ops,
                                                                      Arena& scratch) {
  ensure_tables(config.n_layers);
  view_overlap_sets_.push_back(make_overlap_set(config, chunks, ops, scratch));
  return view_overlap_sets_.back();
}

void RoleExpertParallel::attach_reusing(Transformer<float>& model) {
  model.set_expert_parallel(reused_dispatchers(model.config().n_layers));
}

std::vector<ExpertDispatcher*> RoleExpertParallel::reused_dispatchers(int layers) {
  ensure_tables(layers);
  if (reused_.empty()) reused_ = make_dispatcher_set(layers);
  return reused_;
}

std::vector<ExpertDispatcher*> RoleExpertParallel::view_dispatchers(int index, int layers) {
  ensure_tables(layers);
  while (int(view_sets_.size()) <= index) view_sets_.push_back(make_dispatcher_set(layers));
  return view_sets_[size_t(index)];
}

std::vector<ExpertDispatcher*> RoleExpertParallel::make_dispatcher_set(int layers) {
  std::vector<ExpertDispatcher*> set;
  for (int l = 0; l < layers; ++l) {
    dispatchers_.push_back(make_dispatcher(l));
    set.push_back(dispatchers_.back().get());
  }
  return set;
}

uint64_t RoleExpertParallel::fill_redundant_slots(float* params, const ParameterLayout& layout) {
  if (redundant_ == 0) return 0;
  ensure_tables(expert_layers(layout));
  // The spare slots hold nothing yet: every one receives its expert from a slot that has it.
  std::vector<std::vector<int>> empty_spares = slot_expert_;
  const int local = local_slots(), own = experts_ / degree_;
  for (std::vector<int>& table : empty_spares)
    for (size_t s = 0; s < table.size(); ++s)
      if (int(s) % local >= own) table[s] = kEmptySlot;
  const TrafficScope traffic(links_, TrafficKind::ExpertMigration);
  return copy_experts_into_slots(empty_spares, slot_expert_, experts_, local, slot_ranges(layout),
                                 {params}, ep_group_.comm, &links_);
}

uint64_t RoleExpertParallel::migrate_slots(const std::vector<std::vector<int>>& slot_expert,
                                           const ParameterLayout& layout,
                                           const std::vector<float*>& buffers) {
  ensure_tables(expert_layers(layout));
  if (slot_expert.size() != slot_expert_.size()) {
    throw std::invalid_argument(
        "RoleExpertParallel::migrate_slots: " + std::to_string(slot_expert.size()) +
        " tables for " + std::to_string(slot_expert_.size()) + " layers");
  }
  // Every table is checked before any message; then the dispatchers follow.
  for (const std::vector<int>& table : slot_expert) check_slot_table(table);
  uint64_t sent = 0;
  if (slot_expert != slot_expert_) {
    const TrafficScope traffic(links_, TrafficKind::ExpertMigration);
    sent = copy_experts_into_slots(slot_expert_, slot_expert, experts_, local_slots(),
                                   slot_ranges(layout), buffers, ep_group_.comm, &links_);
  }
  route_by(slot_expert);
  return sent;
}

void RoleExpertParallel::adopt_slots(const std::vector<std::vector<int>>& slot_expert, int layers) {
  ensure_tables(layers);
  if (slot_expert.size() != slot_expert_.size()) {
    throw std::invalid_argument(
        "RoleExpertParallel::adopt_slots: " + std::to_string(slot_expert.size()) + " tables for " +
        std::to_string(slot_expert_.size()) + " layers");
  }
  for (const std::vector<int>& table : slot_expert) check_slot_table(table);
  route_by(slot_expert);
}

void RoleExpertParallel::route_by(const std::vector<std::vector<int>>& slot_expert) {
  slot_expert_ = slot_expert;
  for (size_t l = 0; l < slot_expert_.size(); ++l)
    slot_of_[l] = first_replicas(slot_expert_[l], experts_);
  // attach and attach_reusing make the dispatchers (and attach the overlapped chunks' ones) a
  // model's layers at a time.
  const size_t layers = slot_expert_.size();
  for (size_t i = 0; i < dispatchers_.size(); ++i)
    route_by_tables(*dispatchers_[i], redundant_, slot_of_[i % layers], slot_expert_[i % layers]);
  for (size_t i = 0; i < overlapped_.size(); ++i)
    route_by_tables(*overlapped_[i], redundant_, slot_of_[i % layers], slot_expert_[i % layers]);
}

void RoleExpertParallel::check_slot_table(const std::vector<int>& table) const {
  const int local = local_slots();
  bool valid = int(table.size()) == degree_ * local;
  std::vector<int> held(size_t(experts_), 0);
  for (size_t s = 0; valid && s < table.size(); ++s) {
    const int e = table[s];
    valid = e >= 0 && e < experts_;
    if (!valid) break;
    ++held[size_t(e)];
    for (size_t t = s / size_t(local) * size_t(local); t < s; ++t) valid = valid && table[t] != e;
  }
  for (int count : held) valid = valid && count > 0;
  if (!valid) {
    throw std::invalid_argument(
        "RoleExpertParallel::migrate_slots: a table must hold every expert, never twice on one "
        "rank, in " +
        std::to_string(degree_ * local) + " slots");
  }
}

uint64_t RoleExpertParallel::migrate_experts(const std::vector<std::vector<int>>& slot_of,
                                             const ParameterLayout& layout,
                                             const std::vector<float*>& buffers) {
  ensure_tables(expert_layers(layout));
  if (redundant_ > 0) {
    throw std::logic_error(
        "RoleExpertParallel::migrate_experts: with redundant slots, use migrate_slots");
  }
  if (slot_of.size() != slot_of_.size()) {
    throw std::invalid_argument(
        "RoleExpertParallel::migrate_experts: " + std::to_string(slot_of.size()) + " tables for " +
        std::to_string(slot_of_.size()) + " layers");
  }
  // As slot tables (a permutation's inverse); a table that is no permutation fails the check.
  std::vector<std::vector<int>> slot_expert(slot_of.size(), std::vector<int>(size_t(experts_), -1));
  for (size_t l = 0; l < slot_of.size(); ++l) {
    for (int e = 0; e < experts_ && size_t(e) < slot_of[l].size(); ++e) {
      const int s = slot_of[l][size_t(e)];
      if (s >= 0 && s < experts_) slot_expert[l][size_t(s)] = e;
    }
    if (slot_of[l].size() != size_t(experts_)) slot_expert[l].clear();
  }
  return migrate_slots(slot_expert, layout, buffers);
}

uint64_t RoleExpertParallel::migrate_experts(const std::vector<int>& slot_of,
                                             const ParameterLayout& layout,
                                             const std::vector<float*>& buffers) {
  ensure_tables(expert_layers(layout));
  return migrate_experts(std::vector<std::vector<int>>(slot_of_.size(), slot_of), layout, buffers);
}

int RoleExpertParallel::replicated_experts() const {
  int replicated = 0;
  for (const auto& layer : replica_slots(slot_expert_, experts_))
    for (const std::vector<int>& slots : layer) replicated += slots.size() > 1;
  return replicated;
}

OptimizerShard RoleExpertParallel::optimizer_shard(const ParameterLayout& layout) const {
  OptimizerShard shard;
  const int layers = expert_layers(layout), local = local_slots(), first = ep_rank_ * local;
  shard.replicated = replicated_ranges(layout);
  shard.owned = expert_slices(layout, first, local);
  for (int l = 0; l < layers; ++l)
    for (int s = 0; s < local; ++s)
      shard.owned_slots.push_back(expert_slices(layout, first + s, 1, l));
  // Each (layer, expert) entry has one nonzero term in the allreduce (its first replica's
  // holder's, the slot counts_in_norm marks), so every expert counts once, the sum is exact and
  // the total's grouping depends on layers and expert ids only. Reads the tables in force at
  // each step.
  shard.sum_over_group = [this, layers, local, first](const std::vector<double>& per_slot) {
    std::vector<double> per_expert(size_t(layers) * size_t(experts_), 0.0);
    for (int l = 0; l < layers; ++l) {
      for (int e = 0; e < experts_; ++e) {
        const int slot = slot_of_.empty() ? e : slot_of_[size_t(l)][size_t(e)];
        if (slot / local == ep_rank_) {
          per_expert[size_t(l) * size_t(experts_) + size_t(e)] =
              per_slot[size_t(l) * size_t(local) + size_t(slot - first)];
        }
      }
    }
    MPI_Allreduce(MPI_IN_PLACE, per_expert.data(), int(per_expert.size()), MPI_DOUBLE, MPI_SUM,
                  ep_group_.comm);
    double sum = 0;
    for (double x : per_expert) sum += x;
    return sum;
  };
  return shard;
}

uint64_t RoleExpertParallel::reduce_gradients(float* grads, const ParameterLayout& layout) {
  const uint64_t before = bytes_sent(links_.counters());
  const TrafficScope gradient_traffic(links_, TrafficKind::GradientReduce);
  const int local = local_slots();
  allreduce_ranges(grads, replicated_ranges(layout), role_, links_);
  allreduce_ranges(grads, expert_slices(layout, ep_rank_ * local, local), expert_data_group_,
                   links_);
  if (redundant_ > 0) {  // (counted on the links like the all-reduces)
    ensure_tables(expert_layers(layout));
    sum_replica_gradients(slot_expert_, experts_, local, slot_ranges(layout), grads, ep_group_.comm,
                          &links_);
  }
  return bytes_sent(links_.counters()) - before;
}

uint64_t RoleExpertParallel::gather_full_model(const float* params, const ParameterLayout& layout,
                                               float* full, const ParameterLayout& full_layout) {
  if (replica_ != 0) return 0;
  constexpr int kTag = 7301;
  const int local = local_slots();
  const std::vector<ParameterRange> mine = expert_slices(layout, ep_rank_ * local, local);
  if (ep_rank_ != 0) {
    const std::vector<float> packed = pack_ranges(params, mine);
    links_.send(packed.data(), packed.size() * sizeof(float), 0, kTag, ep_group_.comm);
    return packed.size() * sizeof(float);
  }
  copy_common_parameters(params, layout, full, full_layout);
  ensure_tables(expert_layers(layout));
  // Every rank's slots laid out as rank 0's own (the same layout but for the slots' ids), then
  // each expert from its first replica, layer by layer: the whole model does not depend on where
  // the experts live nor on how many replicas they have.
  uint64_t received = 0;
  std::vector<float> theirs(size_t(layout.total()));
  for (int r = 0; r < degree_; ++r) {
    const float* slots = params;
    if (r > 0) {
      std::vector<float> packed(size_t(ranges_size(mine)));
      received +=
          links_.recv(packed.data(), packed.size() * sizeof(float), r, kTag, ep_group_.comm);
      unpack_ranges(packed.data(), mine, theirs.data());
      slots = theirs.data();
    }
    for (size_t l = 0; l < slot_of_.size(); ++l) {
      for (int e = 0; e < experts_; ++e) {
        const int slot = slot_of_[l][size_t(e)];
        if (slot / local != r) continue;
        const std::vector<float> one =
            pack_ranges(slots, expert_slices(layout, slot % local, 1, int(l)));
        unpack_ranges(one.data(), expert_slices(full_layout, e, 1, int(l)), full);
      }
    }
  }
  return received;
}

namespace {

// The layer's router statistics of every set (ExpertDispatchers or OverlappedExperts), added
// into `tokens`.
template <typename Dispatcher>
void add_layer_tokens(const std::vector<std::vector<Dispatcher*>>& sets, int layer,
                      std::vector<int64_t>& tokens) {
  for (const std::vector<Dispatcher*>& set : sets) {
    if (layer >= int(set.size())) continue;
    const std::vector<int64_t> taken = set[size_t(layer)]->take_expert_tokens();
    for (size_t e = 0; e < taken.size(); ++e) tokens[e] += taken[e];
  }
}

}  // namespace

std::vector<int64_t> RoleExpertParallel::take_view_expert_tokens(int layer) {
  std::vector<int64_t> tokens(size_t(experts_), 0);
  add_layer_tokens(view_sets_, layer, tokens);
  add_layer_tokens(view_overlap_sets_, layer, tokens);
  return tokens;
}

std::vector<const ExpertDispatcher*> RoleExpertParallel::all_dispatchers() const {
  std::vector<const ExpertDispatcher*> all;
  for (const auto& d : dispatchers_) all.push_back(d.get());
  for (const auto& o : overlapped_)
    for (int c = 0; c < o->chunks(); ++c) all.push_back(&o->dispatcher(c));
  return all;
}

SplitPhaseChain::Time RoleExpertParallel::communication_time() const {
  SplitPhaseChain::Time sum;
  for (const ExpertDispatcher* d : all_dispatchers()) {
    sum.in_flight += d->communication_time().in_flight;
    sum.exposed += d->communication_time().exposed;
  }
  return sum;
}

DispatchTraffic RoleExpertParallel::traffic() const {
  DispatchTraffic sum;
  for (const ExpertDispatcher* d : all_dispatchers()) {
    const DispatchTraffic& t = d->traffic();
    for (size_t c = 0; c < 2; ++c) {
      sum.payload.bytes[c] += t.payload.bytes[c];
      sum.payload.messages[c] += t.payload.messages[c];
      sum.metadata.bytes[c] += t.metadata.bytes[c];
      sum.metadata.messages[c] += t.metadata.messages[c];
    }
    sum.emulated_seconds += t.emulated_seconds;
    sum.expert_rows += t.expert_rows;
  }
  return sum;
}

}  // namespace rlf
