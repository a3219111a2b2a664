// Options that place ranks: role counts, queue shards, virtual nodes and link emulation.
#pragma once

#include "mpi_comm/topology.h"
#include "src/app/options.h"

namespace rlf {

po::options_description layout_options_description(LayoutConfig& layout);

}  // namespace rlf
