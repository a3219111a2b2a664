#include "mpi_comm/wait_policy.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "kernels/error.h"

namespace rlf {
namespace {

double g_poll_seconds = kSharedCorePollSeconds;
std::string g_reason = "default (not chosen yet)";

double parse_override(const char* text) {
  const std::string value(text);
  if (value == "inf") return std::numeric_limits<double>::infinity();
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  if (value.empty() || *end != '\0' || !std::isfinite(seconds) || seconds < 0) {
    throw ConfigError(
        "RLFUSION_WAIT_POLL_SECONDS must be a number of seconds >= 0 or 'inf', got '" + value +
        "'");
  }
  return seconds;
}

}  // namespace

double poll_before_sleep_seconds() {
  return g_poll_seconds;
}

double wait_poll_window(int ranks_on_node, int online_cpus, const char* override_text) {
  if (override_text != nullptr) return parse_override(override_text);
  return ranks_on_node <= online_cpus ? std::numeric_limits<double>::infinity()
                                      : kSharedCorePollSeconds;
}

void choose_wait_policy(MPI_Comm world) {
  int world_rank = 0;
  MPI_Comm_rank(world, &world_rank);
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &node);
  int ranks_on_node = 1;
  MPI_Comm_size(node, &ranks_on_node);
  MPI_Comm_free(&node);
  const int online_cpus = int(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  const char* override_text = std::getenv("RLFUSION_WAIT_POLL_SECONDS");
  g_poll_seconds = wait_poll_window(ranks_on_node, online_cpus, override_text);
  char line[200];
  if (override_text != nullptr) {
    std::snprintf(line, sizeof line, "RLFUSION_WAIT_POLL_SECONDS=%s", override_text);
  } else {
    std::snprintf(line, sizeof line, "%d rank(s) on this node, %d online CPU(s): %s", ranks_on_node,
                  online_cpus, std::isinf(g_poll_seconds) ? "a core each" : "oversubscribed");
  }
  g_reason = line;
}

std::string describe_wait_policy() {
  char line[300];
  if (std::isinf(g_poll_seconds)) {
    std::snprintf(line, sizeof line, "waits poll until their message comes (%s)", g_reason.c_str());
  } else {
    std::snprintf(line, sizeof line, "waits poll %.0f us, then sleep with back-off (%s)",
                  g_poll_seconds * 1e6, g_reason.c_str());
  }
  return line;
}

}  // namespace rlf
