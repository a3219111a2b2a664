#include "src/app/layout_options.h"

#include <boost/program_options.hpp>

namespace rlf {

po::options_description layout_options_description(LayoutConfig& o) {
  po::options_description d("Layout options (more than one rank)");
  auto add = d.add_options();
  add("learners", po::value(&o.learners)->default_value(o.learners),
      "learner ranks (0: the world minus actors and queue ranks)");
  add("actors", po::value(&o.actors)->default_value(o.actors),
      "actor ranks (0: from --actor-fraction)");
  add("actor-fraction", po::value(&o.actor_fraction)->default_value(o.actor_fraction),
      "share of the compute ranks that are actors when no count is given");
  add("queue-ranks", po::value(&o.queue_ranks)->default_value(o.queue_ranks),
      "dedicated DistQueue ranks (0: shards served inside learner ranks)");
  add("queue-shards", po::value(&o.queue_shards)->default_value(o.queue_shards),
      "DistQueue shards");
  add("ranks-per-node", po::value(&o.ranks_per_node)->default_value(o.ranks_per_node),
      "virtual nodes of this many consecutive ranks (0: the real nodes)");
  add("inter-node-bandwidth",
      po::value(&o.links.inter_node_bandwidth)->default_value(o.links.inter_node_bandwidth),
      "emulated inter-node bandwidth in bytes/s (0: no emulation)");
  add("inter-node-latency",
      po::value(&o.links.inter_node_latency)->default_value(o.links.inter_node_latency),
      "emulated inter-node latency in seconds per message (0: none)");
  return d;
}

}  // namespace rlf
