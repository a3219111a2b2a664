// The public report's throughput tables, predicted: Table 1 (one supernode: disaggregated
// synchronous, fused, fused + StaleSync) and Table 2 (1, 2 and 4 supernodes, synchronous vs
// StaleSync, linearity), each row the best strategy the search finds for that setting, printed
// beside the published figure (docs/DEPLOYMIND.md). Predictions only: nothing here is fitted to
// the published figures.
#pragma once

#include <string>
#include <vector>

#include "src/sim/search.h"

namespace rlf::sim {

struct TableRow {
  std::string setting;
  int supernodes = 1;
  double published_tokens_per_second = 0;  // 0: not published
  std::string published_note;
  SearchResult result;  // the best strategy first
};

// Table 1 on one supernode of `cluster`. Each row's search considers EDPB's rebalancing (unless
// `rebalance` is false) with 0 .. `max_redundant_experts` spare expert slots per training EP rank
// (SearchSpace).
std::vector<TableRow> predict_table1(const ModelShape& model, const ModelConfig& config,
                                     ClusterConfig cluster, const RlJob& job,
                                     int max_redundant_experts = 2, bool rebalance = true);
// Table 2 on 1, 2 and 4 supernodes: the best synchronous and StaleSync strategies of one
// supernode, then the same strategies with 2x and 4x their data parallelism and prompts per step
// (weak scaling, as a scaling study runs); rows alternate synchronous and StaleSync.
std::vector<TableRow> predict_table2(const ModelShape& model, const ModelConfig& config,
                                     ClusterConfig cluster, RlJob job,
                                     int max_redundant_experts = 2, bool rebalance = true);

}  // namespace rlf::sim
