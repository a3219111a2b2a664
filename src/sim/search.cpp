#include "src/sim/search.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_reduce.h>

#include <algorithm>
#include <chrono>

namespace rlf::sim {

namespace {

std::vector<int> powers_of_two_up_to(int limit) {
  std::vector<int> out;
  for (int v = 1; v <= limit; v *= 2) out.push_back(v);
  return out;
}

// How many of `devices` may train in a disaggregated deployment: every eighth, and every power of
// two from an eighth up (expert parallelism splits powers of two best).
std::vector<int> learner_device_counts(int devices) {
  std::vector<int> out;
  for (int k = 1; k < 8 && devices % 8 == 0; ++k) out.push_back(devices / 8 * k);
  for (int v = 1; v < devices; v *= 2) {
    if (8 * v >= devices) out.push_back(v);
  }
  if (out.empty()) out.push_back(std::max(1, devices / 2));
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// The axes of the space; an index decodes digit by digit (mixed radix).
struct Axes {
  std::vector<Mode> modes;
  // EDPB: -1 off, else rebalancing with that many spare slots per training EP rank.
  std::vector<int> staleness, tp, pp, vpp, ep, gen_tp, gen_ep, edpb;
  std::vector<int> learner_devices;  // disaggregated: the devices that train
  int devices = 0;
  bool reward_model = false;
  int64_t size() const {
    return int64_t(modes.size()) * int64_t(staleness.size()) * int64_t(tp.size()) *
           int64_t(pp.size()) * int64_t(vpp.size()) * int64_t(ep.size()) * int64_t(gen_tp.size()) *
           int64_t(gen_ep.size()) * int64_t(learner_devices.size()) * int64_t(edpb.size()) * 2 * 2 *
           2 * 2;
  }
};

template <typename T>
const T& digit(const std::vector<T>& axis, int64_t& index) {
  const T& v = axis[size_t(index % int64_t(axis.size()))];
  index /= int64_t(axis.size());
  return v;
}

// False when the index names a duplicate (an axis that does not apply to its mode set to other
// than its first value) or a layout that does not tile the devices.
bool decode(const Axes& a, int64_t index, Strategy& s) {
  s.mode = digit(a.modes, index);
  s.staleness = digit(a.staleness, index);
  s.train.tp = digit(a.tp, index);
  s.train.pp = digit(a.pp, index);
  s.train.vpp = digit(a.vpp, index);
  s.train.ep = digit(a.ep, index);
  s.generate.tp = digit(a.gen_tp, index);
  s.generate.ep = digit(a.gen_ep, index);
  // Generation TP 0: inside the training pipelines, at the training layout (its EP axis then
  // names nothing: only its first value is searched).
  const bool inside_pipelines = s.generate.tp == 0;
  if (inside_pipelines) {
    if (s.mode != Mode::Fused || s.train.pp == 1 || s.generate.ep != a.gen_ep.front()) return false;
    s.generate.tp = s.train.tp;
    s.generate.ep = s.train.ep;
  }
  const int edpb = digit(a.edpb, index);
  s.rebalance = edpb >= 0;
  s.redundant_experts = std::max(0, edpb);
  const size_t split = size_t(index % int64_t(a.learner_devices.size()));
  index /= int64_t(a.learner_devices.size());
  s.offload = index % 2 == 1;
  index /= 2;
  s.ep_overlap = index % 2 == 1;
  index /= 2;
  s.dispatch = index % 2 == 1 ? Dispatch::Dedup : Dispatch::Flat;
  index /= 2;
  s.recompute = index % 2 == 1;
  // fused-all differs from fused only by a learned reward model on the devices.
  if (s.mode == Mode::FusedAll && !a.reward_model) return false;
  const bool disaggregated = s.mode == Mode::Disaggregated;
  if (disaggregated ? s.offload : split != 0) return false;
  if (s.train.pp == 1 && s.train.vpp != 1) return false;
  if (s.train.ep == 1 && s.generate.ep == 1 && (s.ep_overlap || s.dispatch == Dispatch::Dedup))
    return false;
  if (s.train.ep == 1 && s.rebalance) return false;
  int train_devices = a.devices, generate_devices = a.devices;
  if (disaggregated) {
    train_devices = a.learner_devices[split];
    generate_devices = a.devices - train_devices;
  }
  const int model_parallel = s.train.tp * s.train.pp;
  if (train_devices % model_parallel != 0 || generate_devices % s.generate.tp != 0) return false;
  s.train.dp = train_devices / model_parallel;
  s.generate.pp = inside_pipelines ? s.train.pp : 1;
  s.generate.vpp = inside_pipelines ? s.train.vpp : 1;
  s.generate.dp = generate_devices / (s.generate.tp * s.generate.pp);
  return true;
}

struct Best {
  std::array<Ranked, kKeepBest> items;
  int count = 0;
  int64_t evaluated = 0, feasible = 0, fitting = 0;

  void offer(const Strategy& s, const Prediction& p) {
    if (count == kKeepBest &&
        p.tokens_per_second <= items[kKeepBest - 1].prediction.tokens_per_second)
      return;
    int i = count < kKeepBest ? count++ : kKeepBest - 1;
    for (; i > 0 && items[size_t(i - 1)].prediction.tokens_per_second < p.tokens_per_second; --i)
      items[size_t(i)] = items[size_t(i - 1)];
    items[size_t(i)] = Ranked{s, p};
  }
  void merge(const Best& other) {
    for (int i = 0; i < other.count; ++i)
      offer(other.items[size_t(i)].strategy, other.items[size_t(i)].prediction);
    evaluated += other.evaluated;
    feasible += other.feasible;
    fitting += other.fitting;
  }
};

}  // namespace

SearchResult search(const ModelShape& model, const ModelConfig& config,
                    const ClusterConfig& cluster, const RlJob& job, const SearchSpace& space) {
  Axes a;
  a.devices = space.devices;
  a.reward_model = job.reward_model;
  a.modes = space.modes;
  a.staleness = space.staleness;
  const int max_tp = space.max_tp > 0 ? space.max_tp : cluster.devices_per_node;
  a.tp = powers_of_two_up_to(max_tp);
  a.pp = powers_of_two_up_to(space.max_pp);
  a.vpp = powers_of_two_up_to(space.max_vpp);
  a.ep = powers_of_two_up_to(config.n_experts);
  a.learner_devices = learner_device_counts(space.devices);
  a.gen_tp = a.tp;
  // (0: generation inside the training pipelines, a fused layout of its own.)
  if (space.generation_inside_pipelines &&
      std::find(a.modes.begin(), a.modes.end(), Mode::Fused) != a.modes.end())
    a.gen_tp.push_back(0);
  a.gen_ep = a.ep;
  // A uniform router gains nothing from placing experts: no EDPB strategies then.
  a.edpb.push_back(-1);
  if (space.rebalance && job.router_max_over_mean > 1)
    for (int r = 0; r <= std::max(0, space.max_redundant_experts); ++r) a.edpb.push_back(r);
  const auto start = std::chrono::steady_clock::now();
  const Best best = tbb::parallel_reduce(
      tbb::blocked_range<int64_t>(0, a.size(), 4096), Best{},
      [&](const tbb::blocked_range<int64_t>& range, Best found) {
        Strategy s;
        for (int64_t i = range.begin(); i != range.end(); ++i) {
          ++found.evaluated;
          if (!decode(a, i, s) || !feasible(config, job, s)) continue;
          ++found.feasible;
          const Prediction p = predict(model, cluster, job, s);
          if (!p.fits) continue;
          ++found.fitting;
          found.offer(s, p);
        }
        return found;
      },
      [](Best x, const Best& y) {
        x.merge(y);
        return x;
      });
  SearchResult result;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.evaluated = best.evaluated;
  result.feasible = best.feasible;
  result.fitting = best.fitting;
  result.best.assign(best.items.begin(), best.items.begin() + best.count);
  return result;
}

}  // namespace rlf::sim
