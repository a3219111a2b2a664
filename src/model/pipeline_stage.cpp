#include "src/model/pipeline_stage.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "src/model/sequence_loss.h"

namespace rlf {

namespace {

void check_chunks(const std::vector<LayerRange>& chunks, int n_layers) {
  if (chunks.empty()) throw std::invalid_argument("PipelineStage: no chunk");
  std::vector<bool> used(size_t(n_layers), false);
  for (const LayerRange& c : chunks) {
    if (c.first < 0 || c.first >= c.last || c.last > n_layers) {
      throw std::invalid_argument("PipelineStage: layers [" + std::to_string(c.first) + ", " +
                                  std::to_string(c.last) + ") are not a non-empty range of the " +
                                  std::to_string(n_layers) + " layers");
    }
    for (int l = c.first; l < c.last; ++l) {
      if (used[size_t(l)]) {
        throw std::invalid_argument("PipelineStage: layer " + std::to_string(l) +
                                    " is in two chunks");
      }
      used[size_t(l)] = true;
    }
  }
}

}  // namespace

LayerShard other_stages_layer_shard(const LayerShard& stored, int n_layers) {
  if (stored.layers.empty() || int(stored.layers.size()) >= n_layers) {
    throw std::invalid_argument("other_stages_layer_shard: the stage stores every layer");
  }
  LayerShard others;
  others.embedding = !stored.embedding;
  others.head = !stored.head;
  for (int l = 0; l < n_layers; ++l)
    if (!stored.stores_layer(l)) others.layers.push_back(l);
  return others;
}

LayerShard stage_layer_shard(const std::vector<LayerRange>& chunks, int n_layers) {
  check_chunks(chunks, n_layers);
  LayerShard shard;
  shard.embedding = shard.head = false;
  for (const LayerRange& c : chunks) {
    for (int l = c.first; l < c.last; ++l) shard.layers.push_back(l);
    shard.embedding = shard.embedding || c.first == 0;
    shard.head = shard.head || c.last == n_layers;
  }
  std::sort(shard.layers.begin(), shard.layers.end());
  return shard;
}

template <typename T>
PipelineStage<T>::PipelineStage(const ModelConfig& config, const Ops<T>& ops, Arena& device,
                                std::vector<LayerRange> chunks, size_t activation_bytes)
    : config_(config),
      chunks_(std::move(chunks)),
      activation_bytes_(activation_bytes),
      owned_model_(std::make_unique<Transformer<T>>(config, ops, device, /*with_gradients=*/true,
                                                    ExpertShard{},
                                                    stage_layer_shard(chunks_, config.n_layers))),
      model_(*owned_model_) {}

template <typename T>
PipelineStage<T>::PipelineStage(Transformer<T>& model, std::vector<LayerRange> chunks,
                                size_t activation_bytes)
    : config_(model.config()),
      chunks_(std::move(chunks)),
      activation_bytes_(activation_bytes),
      model_(model) {
  // With tensor parallelism, the model's TP slice of those layers (it runs the TP collectives);
  // with expert parallelism, its experts (the views run them with dispatchers of their own; with
  // redundant slots in slot space, the dispatchers splitting a replicated expert's tokens).
  const ParameterLayout& have = model.layout();
  const ParameterLayout want(config_, have.stored_expert_shard(),
                             stage_layer_shard(chunks_, config_.n_layers), have.tensor_slice());
  if (have.total() != want.total() || have.tensors().size() != want.tensors().size()) {
    throw std::invalid_argument("PipelineStage: the model must hold exactly the chunks' layers");
  }
}

template <typename T>
int PipelineStage<T>::take_slot() {
  if (free_slots_.empty()) {
    const int slot = int(arenas_.size());
    // The device's kind of memory: on a GPU the kernels run on these activations.
    arenas_.push_back(std::make_unique<Arena>("pipeline activations " + std::to_string(slot),
                                              activation_bytes_, model_.device().kind()));
    views_.push_back(std::make_unique<Transformer<T>>(model_, *arenas_.back()));
    if (dispatchers_) views_.back()->set_expert_parallel(dispatchers_(slot));
    if (overlap_) views_.back()->set_expert_overlap(overlap_(slot, *arenas_.back()));
    return slot;
  }
  const int slot = free_slots_.back();
  free_slots_.pop_back();
  return slot;
}

template <typename T>
const T* PipelineStage<T>::forward(int index, int k, const PipelineMicroBatch<T>& batch,
                                   const T* x_in) {
  const T* result = nullptr;
  run_to_end(forward_pass(index, k, batch, x_in, &result));
  return result;
}

template <typename T>
void PipelineStage<T>::backward(int index, int k, const T* dy, T aux_weight, T* dx_in) {
  run_to_end(backward_pass(index, k, dy, aux_weight, dx_in));
}

template <typename T>
ResumablePass PipelineStage<T>::forward_pass(int index, int k, const PipelineMicroBatch<T>& batch,
                                             const T* x_in, const T** result) {
  const auto key = std::pair(index, k);
  if (in_flight_.count(key)) {
    throw std::logic_error("PipelineStage: micro-batch " + std::to_string(index) + " chunk " +
                           std::to_string(k) + " is already in flight");
  }
  const LayerRange& range = chunk(k);
  const int slot = take_slot();
  Transformer<T>& view = *views_[size_t(slot)];
  const T* out = nullptr;
  co_await view.forward_range_pass(batch.tokens.data(), batch.seq_offsets.data(), batch.sequences(),
                                   embeds(k) ? nullptr : x_in, range.first, range.last, &out);
  aux_loss_ += view.aux_loss() * batch.aux_scale;
  InFlight entry{slot, nullptr};
  if (ends_model(k)) {
    const int N = batch.token_count(), V = config_.vocab_size;
    Arena& arena = *arenas_[size_t(slot)];
    // A forward-only stage (no gradients) has no loss gradient to keep.
    if (model_.gradients()) {
      entry.dlogits = arena.allocate_zeroed<T>(size_t(N) * V, "pipeline loss gradient");
    }
    loss_ += loss_function_ ? loss_function_(index, out, N, V, arena, entry.dlogits)
                            : weighted_nll(model_.ops(), arena, out, batch.targets.data(),
                                           batch.weights.data(), N, V, entry.dlogits);
    out = nullptr;
  }
  in_flight_[key] = entry;
  *result = out;
}

template <typename T>
ResumablePass PipelineStage<T>::backward_pass(int index, int k, const T* dy, T aux_weight,
                                              T* dx_in) {
  auto found = in_flight_.find(std::pair(index, k));
  if (found == in_flight_.end()) {
    throw std::logic_error("PipelineStage: backward of micro-batch " + std::to_string(index) +
                           " chunk " + std::to_string(k) + " before its forward");
  }
  if (!model_.gradients()) throw std::logic_error("PipelineStage: backward without gradients");
  const InFlight entry = found->second;
  in_flight_.erase(found);
  co_await views_[size_t(entry.slot)]->backward_range_pass(ends_model(k) ? entry.dlogits : dy,
                                                           aux_weight, embeds(k) ? nullptr : dx_in);
  free_slots_.push_back(entry.slot);
}

template <typename T>
void PipelineStage<T>::release(int index, int k) {
  auto found = in_flight_.find(std::pair(index, k));
  if (found == in_flight_.end()) {
    throw std::logic_error("PipelineStage: release of micro-batch " + std::to_string(index) +
                           " chunk " + std::to_string(k) + " before its forward");
  }
  const int slot = found->second.slot;
  in_flight_.erase(found);
  views_[size_t(slot)]->release_activations();
  free_slots_.push_back(slot);
}

template <typename T>
size_t PipelineStage<T>::activation_peak() const {
  size_t peak = 0;
  for (const auto& arena : arenas_) peak = std::max(peak, arena->peak());
  return peak;
}

template class PipelineStage<float>;
template class PipelineStage<double>;

}  // namespace rlf
