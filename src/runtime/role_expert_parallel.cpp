#include "src/runtime/role_expert_parallel.h"

#include <cstring>
#include <map>
#include <numeric>
#include <stdexcept>
#include <string>

#include "kernels/error.h"
#include "src/model/expert_parallel.h"
#include "src/runtime/expert_migration.h"

namespace rlf {

namespace {

uint64_t bytes_sent(const LinkCounters& c) {
  return c.bytes[0] + c.bytes[1];
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
                                       int degree, DispatchMode mode)
    : role_(role), links_(links), experts_(experts), degree_(degree), mode_(mode) {
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
  if (!slot_of_.empty()) return;
  slot_of_.assign(size_t(layers), std::vector<int>(size_t(experts_)));
  for (std::vector<int>& table : slot_of_) std::iota(table.begin(), table.end(), 0);
}

void RoleExpertParallel::attach(Transformer<float>& model, int overlap_chunks) {
  const ModelConfig& config = model.config();
  ensure_tables(config.n_layers);
  std::vector<ExpertDispatcher*> per_layer;
  for (int l = 0; l < config.n_layers; ++l) {
    dispatchers_.push_back(std::make_unique<ExpertDispatcher>(ep_group_, links_, experts_, mode_));
    dispatchers_.back()->set_expert_slots(slot_of_[size_t(l)]);
    per_layer.push_back(dispatchers_.back().get());
  }
  model.set_expert_parallel(std::move(per_layer));
  if (overlap_chunks <= 1) return;
  std::vector<OverlappedExperts*> overlapped;
  for (int l = 0; l < config.n_layers; ++l) {
    overlapped_.push_back(std::make_unique<OverlappedExperts>(
        ep_group_, links_, experts_, mode_, overlap_chunks, config.d_model, config.d_ff,
        model.ops(), model.device()));
    overlapped_.back()->set_expert_slots(slot_of_[size_t(l)]);
    overlapped.push_back(overlapped_.back().get());
  }
  model.set_expert_overlap(std::move(overlapped));
}

void RoleExpertParallel::attach_reusing(Transformer<float>& model) {
  ensure_tables(model.config().n_layers);
  if (reused_.empty()) {
    for (int l = 0; l < model.config().n_layers; ++l) {
      dispatchers_.push_back(
          std::make_unique<ExpertDispatcher>(ep_group_, links_, experts_, mode_));
      dispatchers_.back()->set_expert_slots(slot_of_[size_t(l)]);
      reused_.push_back(dispatchers_.back().get());
    }
  }
  model.set_expert_parallel(reused_);
}

uint64_t RoleExpertParallel::migrate_experts(const std::vector<std::vector<int>>& slot_of,
                                             const ParameterLayout& layout,
                                             const std::vector<float*>& buffers) {
  ensure_tables(expert_layers(layout));
  if (slot_of.size() != slot_of_.size()) {
    throw std::invalid_argument(
        "RoleExpertParallel::migrate_experts: " + std::to_string(slot_of.size()) + " tables for " +
        std::to_string(slot_of_.size()) + " layers");
  }
  // Each changed layer's table is checked before its messages; then the dispatchers follow.
  uint64_t sent = 0;
  for (size_t l = 0; l < slot_of.size(); ++l) {
    if (slot_of[l] == slot_of_[l]) continue;
    sent += move_expert_slots(slot_of_[l], slot_of[l], layout, experts_ / degree_, buffers,
                              ep_group_.comm, int(l));
  }
  // attach and attach_reusing make the dispatchers (and attach the overlapped chunks' ones) a
  // model's layers at a time.
  for (size_t i = 0; i < dispatchers_.size(); ++i)
    dispatchers_[i]->set_expert_slots(slot_of[i % slot_of.size()]);
  for (size_t i = 0; i < overlapped_.size(); ++i)
    overlapped_[i]->set_expert_slots(slot_of[i % slot_of.size()]);
  slot_of_ = slot_of;
  return sent;
}

uint64_t RoleExpertParallel::migrate_experts(const std::vector<int>& slot_of,
                                             const ParameterLayout& layout,
                                             const std::vector<float*>& buffers) {
  ensure_tables(expert_layers(layout));
  return migrate_experts(std::vector<std::vector<int>>(slot_of_.size(), slot_of), layout, buffers);
}

OptimizerShard RoleExpertParallel::optimizer_shard(const ParameterLayout& layout) const {
  OptimizerShard shard;
  shard.replicated = replicated_ranges(layout);
  shard.owned = expert_slices(layout, this->shard().first, this->shard().count);
  const int layers = expert_layers(layout), local = this->shard().count;
  for (int l = 0; l < layers; ++l)
    for (int s = 0; s < local; ++s)
      shard.owned_slots.push_back(expert_slices(layout, this->shard().first + s, 1, l));
  // Each (layer, expert) entry has one nonzero term in the allreduce (its holder's), so the sum
  // is exact and the total's grouping depends on layers and expert ids only. Reads the tables in
  // force at each step.
  shard.sum_over_group = [this, layers, local](const std::vector<double>& per_slot) {
    std::vector<double> per_expert(size_t(layers) * size_t(experts_), 0.0);
    for (int l = 0; l < layers; ++l) {
      for (int e = 0; e < experts_; ++e) {
        const int slot = slot_of_.empty() ? e : slot_of_[size_t(l)][size_t(e)];
        if (slot / local == ep_rank_) {
          per_expert[size_t(l) * size_t(experts_) + size_t(e)] =
              per_slot[size_t(l) * size_t(local) + size_t(slot - this->shard().first)];
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
  allreduce_ranges(grads, replicated_ranges(layout), role_, links_);
  allreduce_ranges(grads, expert_slices(layout, shard().first, shard().count), expert_data_group_,
                   links_);
  return bytes_sent(links_.counters()) - before;
}

uint64_t RoleExpertParallel::gather_full_model(const float* params, const ParameterLayout& layout,
                                               float* full, const ParameterLayout& full_layout) {
  if (replica_ != 0) return 0;
  constexpr int kTag = 7301;
  const int local = experts_ / degree_;
  if (ep_rank_ != 0) {
    const std::vector<float> mine =
        pack_ranges(params, expert_slices(layout, shard().first, local));
    links_.send(mine.data(), mine.size() * sizeof(float), 0, kTag, ep_group_.comm);
    return mine.size() * sizeof(float);
  }
  copy_common_parameters(params, layout, full, full_layout);
  uint64_t received = 0;
  for (int r = 1; r < degree_; ++r) {
    const std::vector<ParameterRange> ranges = expert_slices(full_layout, r * local, local);
    std::vector<float> theirs(size_t(ranges_size(ranges)));
    received += links_.recv(theirs.data(), theirs.size() * sizeof(float), r, kTag, ep_group_.comm);
    unpack_ranges(theirs.data(), ranges, full);
  }
  // After a migration the gathered slots hold experts in slot order: back to expert order,
  // layer by layer.
  for (size_t l = 0; l < slot_of_.size(); ++l) {
    std::vector<std::vector<float>> by_slot(static_cast<size_t>(experts_));
    for (int s = 0; s < experts_; ++s)
      by_slot[size_t(s)] = pack_ranges(full, expert_slices(full_layout, s, 1, int(l)));
    for (int e = 0; e < experts_; ++e) {
      unpack_ranges(by_slot[size_t(slot_of_[l][size_t(e)])].data(),
                    expert_slices(full_layout, e, 1, int(l)), full);
    }
  }
  return received;
}

DispatchTraffic RoleExpertParallel::traffic() const {
  std::vector<const ExpertDispatcher*> all;
  for (const auto& d : dispatchers_) all.push_back(d.get());
  for (const auto& o : overlapped_)
    for (int c = 0; c < o->chunks(); ++c) all.push_back(&o->dispatcher(c));
  DispatchTraffic sum;
  for (const ExpertDispatcher* d : all) {
    const DispatchTraffic& t = d->traffic();
    for (size_t c = 0; c < 2; ++c) {
      sum.payload.bytes[c] += t.payload.bytes[c];
      sum.payload.messages[c] += t.payload.messages[c];
      sum.metadata.bytes[c] += t.metadata.bytes[c];
      sum.metadata.messages[c] += t.metadata.messages[c];
    }
    sum.emulated_seconds += t.emulated_seconds;
  }
  return sum;
}

}  // namespace rlf
