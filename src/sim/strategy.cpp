#include "src/sim/strategy.h"

#include <cstdio>
#include <string>

#include "kernels/error.h"

namespace rlf::sim {

const char* mode_name(Mode mode) {
  switch (mode) {
    case Mode::Disaggregated:
      return "disaggregated";
    case Mode::Fused:
      return "fused";
    case Mode::FusedAll:
      break;
  }
  return "fused-all";
}

Mode parse_mode(const std::string& name, const std::string& option) {
  for (Mode m : {Mode::Disaggregated, Mode::Fused, Mode::FusedAll}) {
    if (name == mode_name(m)) return m;
  }
  throw ConfigError(option + " must be disaggregated, fused or fused-all, got '" + name + "'");
}

std::string Strategy::describe() const {
  char buffer[192];
  const Parallelism& t = train;
  const Parallelism& g = generate;
  // (Generation inside the training pipelines: its PP after its TP.)
  char gen_pp[16] = "";
  if (g.pp > 1) std::snprintf(gen_pp, sizeof gen_pp, "p%d", g.pp);
  std::snprintf(buffer, sizeof buffer, "%s train t%dp%dv%de%dd%d gen t%d%se%dd%d s%d%s%s%s%s%s",
                mode_name(mode), t.tp, t.pp, t.vpp, t.ep, t.dp, g.tp, gen_pp, g.ep, g.dp, staleness,
                mode != Mode::Disaggregated && offload ? " offload" : "",
                ep_overlap ? " overlap" : "", dispatch == Dispatch::Dedup ? " dedup" : "",
                recompute ? " recompute" : "",
                redundant_experts > 0 ? (" r" + std::to_string(redundant_experts)).c_str()
                : rebalance           ? " rebalance"
                                      : "");
  return buffer;
}

}  // namespace rlf::sim
