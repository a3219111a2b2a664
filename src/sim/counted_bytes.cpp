#include "src/sim/counted_bytes.h"

#include <algorithm>
#include <set>

#include "src/roles/queue_protocol.h"
#include "src/roles/sample_packing.h"

namespace rlf::sim {

namespace {

// A hierarchical broadcast or tree reduction of `bytes` over the given world ranks: every rank
// but the root receives it once; one message per node but the root's crosses nodes.
KindBytes tree_bytes(const std::set<int>& nodes, int members, uint64_t bytes) {
  const uint64_t n = nodes.size();
  return {(uint64_t(members) - n) * bytes, (n - 1) * bytes, true};
}

KindBytes not_exact() {
  KindBytes k;
  k.exact = false;
  return k;
}

struct Nodes {
  int per_node;
  int of(int rank) const { return rank / per_node; }
  // Adds `bytes` sent from world rank `from` to `to` to the link class they span.
  void add(KindBytes& k, int from, int to, uint64_t bytes) const {
    (of(from) == of(to) ? k.intra : k.inter) += bytes;
  }
};

void disaggregated(const RuntimeRun& r, const Nodes& nodes, CountedBytes& out) {
  // One learner (world rank 0) hosting every shard, actors 1..A: the learner's gets are local.
  const int learners = r.ranks - r.actors;
  std::set<int> spanned{nodes.of(0)};
  for (int a = 1; a <= r.actors; ++a) spanned.insert(nodes.of(a));
  // Weight sync: one broadcast before the first step, then one after each step; with StaleSync
  // (actors one step ahead) one after each step from the second to the next-to-last
  // (disaggregated_train.cpp's StaleSchedule).
  const uint64_t syncs =
      r.staleness > 0 ? uint64_t(std::max<int64_t>(1, r.steps - 1)) : uint64_t(r.steps + 1);
  const KindBytes sync = tree_bytes(spanned, r.actors + 1, uint64_t(r.parameters) * 4);
  // (EP actors get each routed expert from its owner instead: not derived.)
  out[TrafficKind::WeightSync] = {sync.intra * syncs, sync.inter * syncs,
                                  learners == 1 && r.actor_expert_parallel == 1};
  // Puts: per actor and shard, a header and one packed buffer; an ack back; a Close at the end.
  const uint64_t shards = uint64_t(r.queue_shards);
  const uint64_t framing_per_actor_step =
      shards * (queue_protocol::kHeaderBytes + kPackHeaderBytes + queue_protocol::kHeaderBytes);
  const uint64_t payload = uint64_t(r.steps) * uint64_t(r.samples_per_step) * kPackMetadataBytes +
                           4 * uint64_t(r.trained_tokens) + 4 * uint64_t(r.response_tokens);
  bool any_intra = false, any_inter = false;
  for (int a = 1; a <= r.actors; ++a) (nodes.of(a) == nodes.of(0) ? any_intra : any_inter) = true;
  const uint64_t queue =
      payload + uint64_t(r.actors) *
                    (uint64_t(r.steps) * framing_per_actor_step + queue_protocol::kHeaderBytes);
  KindBytes& q = out[TrafficKind::RolloutQueue];
  (any_inter ? q.inter : q.intra) = queue;
  // (Actors on both sides of a node boundary: the payload's split over them is unknown.)
  q.exact = learners == 1 && !(any_intra && any_inter);
  if (r.expert_parallel > 1 || r.actor_expert_parallel > 1) {
    out[TrafficKind::ExpertDispatch] = not_exact();
    out[TrafficKind::FinalGather] = not_exact();  // (not derived: no validation case has it)
  }
}

void fused(const RuntimeRun& r, const Nodes& nodes, CountedBytes& out) {
  const int pp = std::max(1, r.pipeline_parallel), dp = r.ranks / pp;
  const int ep = r.expert_parallel;
  // Gradients: each step's summed over the data-parallel ranks (hierarchical all-reduce: a
  // reduce-scatter inside each node, a ring per share among the nodes, an allgather back; or
  // through the node leaders when nodes differ in size: either way intra 2 (P - N) b, inter
  // 2 (N - 1) b, hierarchical_collectives.h). With expert parallelism only the replicated
  // tensors go over all ranks (and the experts over their expert-data group: none when the EP
  // group is the world); inside a pipeline each stage's over its replicas.
  KindBytes& gradients = out[TrafficKind::GradientReduce];
  if (pp == 1) {
    const int64_t reduced = ep > 1 ? r.parameters - r.routed_parameters : r.parameters;
    const uint64_t b = uint64_t(reduced) * 4;
    const uint64_t spanned = uint64_t((r.ranks + nodes.per_node - 1) / nodes.per_node);
    gradients.intra = uint64_t(r.steps) * 2 * (uint64_t(r.ranks) - spanned) * b;
    gradients.inter = uint64_t(r.steps) * 2 * (spanned - 1) * b;
    gradients.exact = ep == 1 || ep == r.ranks;
    if (ep > 1 && r.redundant_experts > 0) {
      // Replicated experts: their holders send each other their gradients (every holder to every
      // other, expert_replicas.h). On 2 EP ranks an expert has at most one copy a rank, so the
      // 2 R spare slots make exactly 2 R experts of 2 holders each, 4 R messages a layer and step
      // (with more ranks the copies per expert follow the placement: not derived).
      gradients.exact = gradients.exact && ep == 2 && r.experts > 0;
      if (gradients.exact) {
        const uint64_t expert_bytes = uint64_t(r.routed_parameters / r.experts) * 4;
        const uint64_t sent = uint64_t(r.steps) * 2 * uint64_t(r.redundant_experts) * expert_bytes;
        nodes.add(gradients, 0, 1, sent);
        nodes.add(gradients, 1, 0, sent);
      }
    }
  } else {
    gradients.exact = dp == 1;  // (one pipeline: nothing to sum)
  }
  if (ep > 1 || r.actor_expert_parallel > 1) out[TrafficKind::ExpertDispatch] = not_exact();
  // Generation at an EP degree of its own receives the experts its layout lacks (the switch's
  // buckets: not derived here).
  if (ep != r.actor_expert_parallel) out[TrafficKind::LayoutSwitch] = not_exact();
  // EDPB: at the start every spare slot receives its first replica's weights (default_slot_experts:
  // rank e's R spare slots the experts after its own, all on EP rank e + 1 while R <= E / P);
  // later migrations move the experts the routing makes hot (not derived).
  KindBytes& migration = out[TrafficKind::ExpertMigration];
  if (ep > 1 && r.redundant_experts > 0) {
    migration.exact =
        !r.migrated && r.experts > 0 && r.redundant_experts <= r.experts / ep && r.ranks == ep;
    if (migration.exact) {
      const uint64_t slots_bytes =
          uint64_t(r.redundant_experts) * uint64_t(r.routed_parameters / r.experts) * 4;
      for (int e = 0; e < ep; ++e) nodes.add(migration, (e + 1) % ep, e, slots_bytes);
    }
  } else if (r.migrated) {
    migration.exact = false;
  }

  // The end: learner 0 gathers the whole model for model.h5. With EP the other EP ranks of the
  // first group send their slots, spare ones included (role_expert_parallel.cpp's
  // gather_full_model); a pipeline's later stages send their stage (gather_pipeline_model).
  KindBytes& gather = out[TrafficKind::FinalGather];
  if (pp > 1) {
    gather.exact = ep == 1 && int(r.stage_parameters.size()) == pp;
    if (gather.exact) {
      for (int s = 1; s < pp; ++s)
        nodes.add(gather, s, 0, uint64_t(r.stage_parameters[size_t(s)]) * 4);
    }
  } else if (ep > 1) {
    gather.exact = r.experts > 0 && r.routed_parameters % r.experts == 0;
    if (gather.exact) {
      const uint64_t slot_bytes = uint64_t(r.routed_parameters / r.experts) * 4;
      const uint64_t slots = uint64_t(r.experts / ep + r.redundant_experts);
      for (int e = 1; e < ep; ++e) nodes.add(gather, e, 0, slots * slot_bytes);
    }
  }
  if (pp == 1) return;

  // Pipeline d's stage s is world rank d PP + s.
  auto world = [pp](int d, int s) { return d * pp + s; };
  // Training: every micro-batch's rows (a sample's tokens but its last, which predicts nothing)
  // go forward across each stage boundary as d_model floats, their gradients back.
  KindBytes& activations = out[TrafficKind::PipelineActivations];
  const uint64_t rows = uint64_t(r.trained_tokens - r.steps * r.samples_per_step);
  const uint64_t row_bytes = uint64_t(r.d_model) * 4;
  std::set<bool> crossings;
  for (int d = 0; d < dp; ++d)
    for (int s = 0; s + 1 < pp; ++s)
      crossings.insert(nodes.of(world(d, s)) != nodes.of(world(d, s + 1)));
  // (Replicas train different samples: with boundaries of both classes their split is unknown.)
  activations.exact = crossings.size() == 1;
  if (activations.exact) {
    (*crossings.begin() ? activations.inter : activations.intra) =
        2 * rows * row_bytes * uint64_t(pp - 1);
  }
  if (r.actor_pipeline_parallel > 1) {
    // Generation inside the pipeline: its messages follow its decode steps, which follow the
    // lengths of particular samples.
    out[TrafficKind::PipelineGeneration] = not_exact();
  } else {
    // Generation from a stitched view: before each step's generation every stage receives the
    // other stages' layers.
    KindBytes& borrowed = out[TrafficKind::LayoutSwitch];
    borrowed.exact = borrowed.exact && ep == 1 && int(r.stage_parameters.size()) == pp;
    if (borrowed.exact) {
      for (int d = 0; d < dp; ++d)
        for (int to = 0; to < pp; ++to)
          for (int from = 0; from < pp; ++from)
            if (from != to) {
              nodes.add(borrowed, world(d, from), world(d, to),
                        uint64_t(r.steps) * uint64_t(r.stage_parameters[size_t(from)]) * 4);
            }
    }
  }
  // The replica's rollouts reach the stages through DistQueue (puts to the shard of each sample
  // id, a leader's get, its fan-out), or with StaleSync an allgather of each pool's finished
  // groups: which samples cross which link follows the sample ids and the pools.
  out[TrafficKind::RolloutQueue] = not_exact();
}

}  // namespace

uint64_t CountedBytes::intra() const {
  uint64_t sum = 0;
  for (const KindBytes& k : kinds) sum += k.intra;
  return sum;
}

uint64_t CountedBytes::inter() const {
  uint64_t sum = 0;
  for (const KindBytes& k : kinds) sum += k.inter;
  return sum;
}

bool CountedBytes::exact() const {
  return std::all_of(kinds.begin(), kinds.end(), [](const KindBytes& k) { return k.exact; });
}

CountedBytes counted_bytes(const RuntimeRun& r) {
  CountedBytes out;
  if (r.ranks <= 1) return out;
  const Nodes nodes{r.ranks_per_node > 0 ? r.ranks_per_node : r.ranks};
  if (r.mode == Mode::Disaggregated) {
    disaggregated(r, nodes, out);
  } else {
    fused(r, nodes, out);
  }
  return out;
}

}  // namespace rlf::sim
