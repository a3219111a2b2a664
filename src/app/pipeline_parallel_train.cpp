#include "src/app/pipeline_parallel_train.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <utility>

#include "kernels/error.h"
#include "src/app/tensor_parallel_train.h"
#include "src/model/activation_memory.h"
#include "src/rl/policy_loss.h"
#include "src/roles/rollout_allgather.h"
#include "src/roles/rollout_samples.h"

namespace rlf {

void validate_pipeline_generation(const DisaggregatedOptions& options, bool fused,
                                  const RlOptions& rl) {
  const int degree = options.pipeline_parallel, generation = options.actor_pipeline_parallel;
  if (generation == 1) return;
  const std::string option = "--actor-pipeline-parallel " + std::to_string(generation);
  if (!fused || degree < 2 || generation != degree) {
    throw ConfigError(option + " needs --mode fused and --pipeline-parallel " +
                      std::to_string(generation) +
                      " (generation inside the training pipelines; 1: data-parallel)");
  }
  // Pipelined generation runs each stage's own layers as training stores them: with TP, each
  // stage's TP group generates from its slices, so at the training TP degree.
  const int generation_tp = generation_tensor_parallel(options);
  if (generation_tp != options.tensor_parallel) {
    throw ConfigError(option + " with --actor-tensor-parallel " + std::to_string(generation_tp) +
                      " is not supported: generation inside the pipelines runs each stage's own "
                      "layers at the training TP degree (--tensor-parallel " +
                      std::to_string(options.tensor_parallel) + ")");
  }
  // With EP, over the stage's training EP group (its own dispatchers).
  if (options.actor_expert_parallel != options.expert_parallel) {
    throw ConfigError(option + " with --actor-expert-parallel " +
                      std::to_string(options.actor_expert_parallel) +
                      " is not supported: generation inside the pipelines runs each stage's own "
                      "experts over its training EP group (--expert-parallel " +
                      std::to_string(options.expert_parallel) + ")");
  }
}

void validate_pipeline_parallel_train(const DisaggregatedOptions& options, bool fused,
                                      int world_size, const RlOptions& rl) {
  const int degree = options.pipeline_parallel;
  const std::string option = "--pipeline-parallel " + std::to_string(degree);
  if (degree < 1) throw ConfigError(option + ": must be a positive integer");
  if (options.virtual_stages < 1) throw ConfigError("--virtual-stages must be >= 1");
  if (options.micro_batches < 0) {
    throw ConfigError("--micro-batches must be >= 0 (0: pieces of --micro-batch)");
  }
  if (options.pipeline_pairing && (degree == 1 || options.expert_parallel < 2)) {
    // Pairing interleaves a forward's and a backward's MoE exchanges: it needs both a schedule
    // that puts forwards next to backwards and exchanges to interleave.
    throw ConfigError(
        "--pipeline-pairing needs --pipeline-parallel 2 or more and "
        "--expert-parallel 2 or more (it interleaves the stages' EP exchanges)");
  }
  validate_pipeline_generation(options, fused, rl);
  if (degree == 1) {
    if (options.virtual_stages != 1 || options.micro_batches != 0 ||
        options.pipeline_balance != "uniform") {
      throw ConfigError(
          "--virtual-stages, --micro-batches and --pipeline-balance need --pipeline-parallel 2 or "
          "more");
    }
    return;
  }
  validate_pipeline_balance(options.pipeline_balance, degree * options.virtual_stages);
  refuse_unsupported_with_model_parallelism(option, options, fused, world_size);
  if (options.tensor_parallel > 1) {
    // TP x PP: TP groups inside every stage; one replica of the model on T x P consecutive ranks.
    const int model_ranks = options.tensor_parallel * degree;
    const std::string both =
        "--tensor-parallel " + std::to_string(options.tensor_parallel) + " x " + option;
    if (world_size % model_ranks != 0) {
      throw ConfigError(both + " = " + std::to_string(model_ranks) +
                        " ranks per model replica must divide the " + std::to_string(world_size) +
                        " ranks");
    }
  }
  if (rl.staleness > 0) {
    // StaleSync: a pipeline trains its ranks' varying counts of finished groups
    // (gather_replica_rollouts), each minibatch its share of every rank's block, in --micro-batch
    // pieces of each or --micro-batches equal parts.
    auto refuse_stale = [&](const std::string& what) {
      throw ConfigError(option + " with --staleness (StaleSync) is not supported " + what);
    };
    // The interleaved schedule runs micro-batches in groups of p: a pipeline's pieces are split
    // until their count is a multiple of p, which whole groups of a multiple of p samples allow.
    if (options.virtual_stages > 1 && rl.group_size % degree != 0) {
      refuse_stale("with --virtual-stages " + std::to_string(options.virtual_stages) +
                   " unless --group-size (" + std::to_string(rl.group_size) +
                   ") is a multiple of " + option +
                   " (the interleaved schedule runs micro-batches in groups of the stages)");
    }
  }
  if (options.expert_parallel > 1 || options.actor_expert_parallel > 1) {
    // An EP group is the ranks of one stage in E consecutive pipelines (with TP: of one TP rank
    // and stage in E consecutive model replicas of T x P ranks). Generation may run at an EP
    // degree of its own (--actor-expert-parallel G): a layout switch over the stage-major order
    // (PipelineGroups::stage_major, per TP rank) after the pipeline's switch, a generation EP group
    // being G consecutive replicas' ranks, so G must divide the replicas.
    const bool tp = options.tensor_parallel > 1;
    const int replica_ranks = degree * std::max(1, options.tensor_parallel);
    const std::string replicas_name = tp ? "model replicas" : "pipelines";
    validate_experts_with_model_parallelism(
        option, options, world_size, replica_ranks,
        tp ? "model replicas (T x P ranks)" : "pipelines",
        tp ? "the ranks of one TP rank and stage" : "the ranks of one stage",
        /*generation_degree_of_its_own=*/true);
    const int replicas = world_size / replica_ranks, generation = options.actor_expert_parallel;
    if (world_size % replica_ranks == 0 && generation > 0 && replicas % generation != 0) {
      throw ConfigError(option + " x --actor-expert-parallel " + std::to_string(generation) +
                        ": the generation EP degree must divide the " + std::to_string(replicas) +
                        " " + replicas_name + " (a generation EP group is " +
                        (tp ? "the ranks of one TP rank and stage in " : "a stage's ranks in ") +
                        std::to_string(generation) + " consecutive " + replicas_name + ")");
    }
  } else if (options.ep_overlap_chunks > 1) {
    // Overlap chunks hide the EP exchanges of the stages' MoE layers: without EP there are none.
    throw ConfigError(option + " with --ep-overlap-chunks " +
                      std::to_string(options.ep_overlap_chunks) +
                      " needs --expert-parallel 2 or "
                      "more (the chunks overlap the stages' EP dispatch and combine)");
  }
}

std::unique_ptr<PipelineGroups> make_train_pipeline(const DisaggregatedOptions& options,
                                                    const ModelConfig& config, int rank_samples,
                                                    int micro_batch, int group_size,
                                                    int minibatches, Topology& topology,
                                                    const StageCostProbe& probe,
                                                    const TensorParallel* tp) {
  if (options.pipeline_parallel <= 1) return nullptr;
  const int p = options.pipeline_parallel;
  // Every rank of a replica (T x P with TP) generated a block of the samples it trains. Each
  // minibatch takes its share of every rank's block (minibatch_begin): the first share is the
  // smallest.
  const int model_ranks = p * (tp ? tp->degree() : 1);
  const int smallest_share = int(minibatch_begin(size_t(rank_samples), group_size, minibatches, 1));
  const int smallest_minibatch = model_ranks * smallest_share;
  const int micro_batches = options.micro_batches > 0
                                ? options.micro_batches
                                : pipeline_micro_batches(model_ranks, smallest_share, micro_batch);
  if (minibatches == 1 && micro_batches > smallest_minibatch) {
    throw ConfigError("--micro-batches " + std::to_string(micro_batches) +
                      ": a pipeline trains only " + std::to_string(smallest_minibatch) +
                      " samples per step (every micro-batch needs one)");
  }
  if (minibatches > 1 && (smallest_share == 0 || micro_batches > smallest_minibatch)) {
    throw ConfigError("--minibatches " + std::to_string(minibatches) + " with --micro-batches " +
                      std::to_string(options.micro_batches) +
                      " (0: pieces of --micro-batch): a pipeline's smallest minibatch holds " +
                      std::to_string(smallest_minibatch) + " samples, which cannot fill its " +
                      std::to_string(std::max(micro_batches, p)) +
                      " micro-batches (every micro-batch needs one)");
  }
  const PipelineShape shape{p, micro_batches, options.virtual_stages};
  std::vector<int> boundaries = pipeline_balance_boundaries(options.pipeline_balance, shape, config,
                                                            probe, topology.role_comm().comm);
  return std::make_unique<PipelineGroups>(
      topology.role_comm().comm, shape, config, topology.links(), tp, options.expert_parallel,
      std::move(boundaries), options.expert_parallel > 1 ? options.rebalance.redundant_experts : 0);
}

int pipeline_micro_batches(int model_ranks, int rank_share, int micro_batch) {
  return model_ranks * ((rank_share + micro_batch - 1) / micro_batch);
}

std::vector<Rollout> pipeline_rollouts(DistQueue& queue, const HierarchicalComm& replica,
                                       const std::vector<Rollout>& own, int group_size,
                                       const std::vector<int>& member_blocks) {
  queue.put(to_queue_samples(own, group_size));
  // Every sample stored before any leader asks: one request per shard, pipeline and range,
  // whatever the timing.
  queue.barrier();
  // The replica's ranks (consecutive: a pipeline, or T x P with TP) generated blocks of equal
  // size: by default consecutive ones, its rank 0's first; after EP training's expert-aligned
  // generation TP groups (expert_aligned_tensor_groups.h) those their places in that order give.
  const int members = replica.size();
  std::vector<int> blocks = member_blocks;
  if (blocks.empty()) {
    blocks.resize(size_t(members));
    std::iota(blocks.begin(), blocks.end(), 0);
  }
  if (int(blocks.size()) != members) {
    throw std::logic_error("pipeline_rollouts: " + std::to_string(blocks.size()) +
                           " blocks for a replica of " + std::to_string(members) + " ranks");
  }
  const int64_t block = int64_t(own.size());
  const int64_t world_first =
      own.front().sample_id - int64_t(blocks[size_t(replica.rank())]) * block;
  std::vector<QueueSample> samples;
  for (int begin = 0, end = 0; begin < members; begin = end) {
    end = begin + 1;
    while (end < members && blocks[size_t(end)] == blocks[size_t(end - 1)] + 1) ++end;
    std::vector<QueueSample> run = queue.get_range_replicated(
        world_first + int64_t(blocks[size_t(begin)]) * block, block * (end - begin), replica);
    samples.insert(samples.end(), std::make_move_iterator(run.begin()),
                   std::make_move_iterator(run.end()));
  }
  // The shards live on ranks that train next: none leaves (and stops serving) before every
  // pipeline has its samples.
  queue.barrier();
  return to_rollouts(samples);
}

std::vector<Rollout> gather_replica_rollouts(const PipelineGroups& groups,
                                             const std::vector<Rollout>& own, int group_size,
                                             std::vector<size_t>& blocks) {
  return allgather_rollouts(groups.model_parallel(), groups.links(), own, group_size, &blocks);
}

std::vector<std::pair<size_t, size_t>> block_pieces(size_t count, int blocks, int piece) {
  std::vector<std::pair<size_t, size_t>> bounds;
  const size_t block = count / size_t(blocks);
  if (block == 0) return bounds;
  for (size_t begin = 0; begin < count; begin += block) {
    const size_t end = std::min(count, begin + block);
    for (size_t b = begin; b < end; b += size_t(piece)) {
      bounds.emplace_back(b, std::min(end, b + size_t(piece)));
    }
  }
  return bounds;
}

size_t stage_activation_bytes(const ModelConfig& config, int sequences, int longest_sequence) {
  // (Pages untouched beyond what a chunk uses cost nothing.)
  return 2 * training_micro_batch_peak_bytes(config, ParameterLayout(config),
                                             uniform_batch(sequences, longest_sequence));
}

int pipeline_micro_batch_sequences(const PipelineGroups& groups, int micro_batch, int rank_samples,
                                   bool equal_parts) {
  const int parts = groups.shape().micro_batches;
  return equal_parts ? (groups.model_parallel().size() * rank_samples + parts - 1) / parts
                     : std::min(micro_batch, rank_samples);
}

size_t pipeline_activation_bytes(const PipelineGroups& groups, const ParameterLayout& layout,
                                 int sequences, int longest_sequence, bool expert_token_split) {
  return pipeline_activation_bytes(groups.config(), groups.shape(), groups.stage(),
                                   groups.chunks(groups.stage()), layout, sequences,
                                   longest_sequence, expert_token_split);
}

size_t pipeline_activation_bytes(const ModelConfig& config, const PipelineShape& shape, int stage,
                                 const std::vector<LayerRange>& chunks,
                                 const ParameterLayout& layout, int sequences, int longest_sequence,
                                 bool expert_token_split) {
  // A training input is its sequence without the last token.
  const PackedBatch batch = uniform_batch(sequences, longest_sequence - 1);
  size_t largest = 0;
  for (const LayerRange& chunk : chunks) {
    largest = std::max(largest, pipeline_chunk_peak_bytes(config, layout, batch, chunk.first,
                                                          chunk.last, expert_token_split));
  }
  return size_t(in_flight_bound(shape, stage)) * largest;
}

PipelineTrainer::PipelineTrainer(const PipelineGroups& groups, Transformer<float>& model,
                                 const RlStepSettings& settings, int rank_samples, bool equal_parts,
                                 int longest_sequence, RoleExpertParallel* ep, int overlap_chunks,
                                 bool pairing)
    : groups_(groups),
      settings_(settings),
      equal_parts_(equal_parts),
      stage_(model, groups.chunks(groups.stage()),
             stage_activation_bytes(model.config(),
                                    pipeline_micro_batch_sequences(groups, settings.micro_batch,
                                                                   rank_samples, equal_parts),
                                    longest_sequence)),
      ep_(ep),
      pairing_(pairing) {
  if (ep) {
    const int layers = model.config().n_layers;
    stage_.set_expert_dispatchers(
        [ep, layers](int slot) { return ep->view_dispatchers(slot, layers); });
  }
  if (ep && overlap_chunks > 1) {
    const ModelConfig config = model.config();
    const Ops<float>* ops = &model.ops();
    stage_.set_expert_overlap([ep, config, overlap_chunks, ops](int, Arena& arena) {
      return ep->make_view_overlap(config, overlap_chunks, *ops, arena);
    });
  }
}

void split_into_stage_multiple(std::vector<std::pair<size_t, size_t>>& bounds, int stages) {
  const size_t p = size_t(stages);
  while (bounds.size() % p != 0) {
    auto largest = std::max_element(bounds.begin(), bounds.end(), [](const auto& a, const auto& b) {
      return a.second - a.first < b.second - b.first;
    });
    if (largest == bounds.end() || largest->second - largest->first < 2) {
      throw std::logic_error("split_into_stage_multiple: " + std::to_string(bounds.size()) +
                             " pieces of one sample cannot make a multiple of " +
                             std::to_string(stages) + " micro-batches");
    }
    const size_t begin = largest->first, middle = begin + (largest->second - begin + 1) / 2;
    largest->first = middle;
    bounds.insert(largest, {begin, middle});
  }
}

std::vector<std::pair<size_t, size_t>> PipelineTrainer::micro_batch_bounds(size_t count,
                                                                           int minibatch) const {
  std::vector<std::pair<size_t, size_t>> bounds;
  if (equal_parts_) {
    // --micro-batches M: M equal parts (with StaleSync some may be empty: a pipeline whose ranks
    // finished fewer than M samples).
    const size_t parts = size_t(groups_.shape().micro_batches);
    for (size_t k = 0; k < parts; ++k)
      bounds.emplace_back(k * count / parts, (k + 1) * count / parts);
    return bounds;
  }
  if (!blocks_.empty()) {
    // StaleSync: this minibatch's share of each rank's block as it came (the share the rank would
    // train in this minibatch on its own, minibatch_begin), each in --micro-batch pieces.
    size_t begin = 0;
    for (const size_t block : blocks_) {
      const size_t share =
          minibatch_begin(block, settings_.group_size, settings_.minibatches, minibatch + 1) -
          minibatch_begin(block, settings_.group_size, settings_.minibatches, minibatch);
      const size_t end = begin + share;
      for (size_t b = begin; b < end; b += size_t(settings_.micro_batch)) {
        bounds.emplace_back(b, std::min(end, b + size_t(settings_.micro_batch)));
      }
      begin = end;
    }
    if (begin != count) {
      throw std::logic_error("PipelineTrainer: the ranks' shares of minibatch " +
                             std::to_string(minibatch) + " hold " + std::to_string(begin) +
                             " samples, the minibatch " + std::to_string(count));
    }
    if (groups_.shape().interleaved() && !bounds.empty())
      split_into_stage_multiple(bounds, groups_.shape().stages);
    return bounds;
  }
  // Each rank's block (its share of this minibatch; with TP every TP rank of every stage
  // generated one) in --micro-batch pieces: the data-parallel run's micro-batches exactly.
  return block_pieces(count, groups_.model_parallel().size(), settings_.micro_batch);
}

PpoStats PipelineTrainer::minibatch_gradient(const std::vector<const Rollout*>& minibatch,
                                             double normalizer, double all_samples) {
  const bool stale = !blocks_.empty();
  auto bounds = micro_batch_bounds(minibatch.size(), stale ? next_minibatch_++ : 0);
  const bool expert_parallel = stage_.model().expert_parallel();
  if (stale && expert_parallel) {
    // StaleSync with EP inside the stages: the pipelines' piece counts differ, but the EP mates
    // must run the same schedule. Every pipeline runs the largest count over the stage's
    // data-parallel group, the extra micro-batches empty (no tokens: their MoE layers exchange
    // nothing but take part; their loss and gradients are zero). Interleaved, every count is a
    // multiple of p already, so the largest is too. (With --micro-batches every pipeline runs
    // that many already.)
    long long most = (long long)bounds.size();
    MPI_Allreduce(MPI_IN_PLACE, &most, 1, MPI_LONG_LONG, MPI_MAX, groups_.data_parallel().comm);
    const size_t end = minibatch.size();
    while ((long long)bounds.size() < most) {
      bounds.emplace_back(end, end);
      ++padded_micro_batches_;
    }
  }
  // (StaleSync: a pipeline whose ranks finished no group this step (or none for this minibatch)
  // adds nothing; all of its ranks hold the same samples, so they skip the schedule together.
  // With EP, only when no pipeline of the group has any.)
  if (stale && (bounds.empty() || (minibatch.empty() && !expert_parallel))) return PpoStats{};
  // This minibatch's micro-batches (in --micro-batch pieces a minibatch with a larger share of the
  // groups may make more than the first).
  PipelineShape shape = groups_.shape();
  shape.micro_batches = int(bounds.size());
  const bool blocks_equal =
      equal_parts_ || stale || minibatch.size() % size_t(groups_.model_parallel().size()) == 0;
  // (Only StaleSync runs empty micro-batches: padding with EP, or fewer samples than
  // --micro-batches.)
  const bool empties_allowed = stale;
  if (bounds.empty() || !blocks_equal ||
      (!empties_allowed && std::any_of(bounds.begin(), bounds.end(),
                                       [](const auto& b) { return b.first == b.second; }))) {
    throw std::logic_error("PipelineTrainer: " + std::to_string(minibatch.size()) +
                           " samples do not fill the pipeline's " + std::to_string(bounds.size()) +
                           " micro-batches");
  }
  if (expert_parallel) {
    // Every MoE layer's dispatch and combine are collective over the stage's EP group, whose ranks
    // (one per pipeline) run the same schedule: with as many micro-batches their collectives come
    // in the same order. Every pipeline trains as many samples (or, with StaleSync, pads to the
    // largest count), so the counts agree; checked over the stage's data-parallel group (a
    // superset of the EP group) rather than assumed.
    long long most_and_least[2] = {(long long)bounds.size(), -(long long)bounds.size()};
    MPI_Allreduce(MPI_IN_PLACE, most_and_least, 2, MPI_LONG_LONG, MPI_MAX,
                  groups_.data_parallel().comm);
    if (most_and_least[0] != -most_and_least[1]) {
      throw std::logic_error("PipelineTrainer: the pipelines of an EP group cut " +
                             std::to_string(-most_and_least[1]) + " to " +
                             std::to_string(most_and_least[0]) + " micro-batches");
    }
  }
  const float aux_coef = stage_.model().config().aux_loss_coef;
  std::vector<std::vector<const Rollout*>> micro_rollouts;
  std::vector<PackedRollouts> packed;
  std::vector<PipelineMicroBatch<float>> batches;
  for (const auto& [begin, end] : bounds) {
    micro_rollouts.emplace_back(minibatch.begin() + std::ptrdiff_t(begin),
                                minibatch.begin() + std::ptrdiff_t(end));
    packed.push_back(pack_rollouts(micro_rollouts.back()));
    PipelineMicroBatch<float> batch;
    batch.tokens = packed.back().inputs;
    batch.seq_offsets = packed.back().offsets;
    batch.aux_scale = float(double(end - begin) / all_samples);
    batches.push_back(std::move(batch));
  }
  PpoStats total;
  const Ops<float>& ops = stage_.model().ops();
  stage_.set_loss([&](int index, const float* logits, int, int V, Arena& arena, float* dlogits) {
    const PpoStats s = policy_loss_gradient(ops, arena, logits, V, packed[size_t(index)],
                                            micro_rollouts[size_t(index)], normalizer,
                                            settings_.temperature, settings_.ppo, dlogits);
    total.loss += s.loss;
    total.clipped_tokens += s.clipped_tokens;
    total.kl_sum += s.kl_sum;
    total.ratio_sum += s.ratio_sum;
    return float(s.loss);
  });
  const SplitPhaseChain::Time ep_before = ep_ ? ep_->communication_time() : SplitPhaseChain::Time{};
  const PipelineStepStats step = run_pipeline_step(
      stage_, shape, batches, aux_coef, groups_.pipeline().comm, groups_.links(), pairing_);
  pairs_ += step.pairs;
  stage_.set_loss({});
  if (ep_) {
    const SplitPhaseChain::Time ep_after = ep_->communication_time();
    ep_communication_.in_flight += ep_after.in_flight - ep_before.in_flight;
    ep_communication_.exposed += ep_after.exposed - ep_before.exposed;
  }
  wall_seconds_ += step.wall_seconds;
  wait_seconds_ += step.wait_seconds;
  compute_seconds_ += step.compute_seconds;
  // Only the last stage computed the loss: every stage returns the pipeline's statistics.
  double sums[4] = {total.loss, total.clipped_tokens, total.kl_sum, total.ratio_sum};
  MPI_Allreduce(MPI_IN_PLACE, sums, 4, MPI_DOUBLE, MPI_SUM, groups_.pipeline().comm);
  return PpoStats{sums[0], sums[1], sums[2], sums[3]};
}

}  // namespace rlf
