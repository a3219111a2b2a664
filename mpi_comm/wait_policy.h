// How long a rank's waits poll before they sleep, chosen once per process.
//
// A wait polls (MPI_Test, yielding the core between tests) and then sleeps with a growing back-off
// (wait_with_backoff in links.h, the split-phase progress loop, DistQueue's idle loops). A sleep
// on this VM lasts 50-100 us however short it is asked to be, and the back-off's longer sleeps
// (up to 1 ms) overshoot the message by up to their length, so a rank that sleeps pays for it
// at every hand-off: a learner waiting for a generation phase, an actor waiting for weights.
// - Every rank on a core of its own (ranks on the node <= online CPUs, the batch-job case):
//   nobody else needs the core, so waits poll until their message comes, as MPI's own blocking
//   calls do.
// - More ranks than cores (oversubscribed tests): the core belongs to the rank being waited for
//   too, so waits poll kSharedCorePollSeconds and then sleep.
// RLFUSION_WAIT_POLL_SECONDS (a number of seconds >= 0, or "inf") overrides the choice.
#pragma once

#include <mpi.h>

#include <string>

namespace rlf {

// The oversubscribed window: long enough for EP's dispatch and combine messages, which come a few
// microseconds apart, short enough to hand the core back soon.
inline constexpr double kSharedCorePollSeconds = 100e-6;

// Seconds a wait polls before its first sleep (infinity: it never sleeps). Until
// choose_wait_policy runs, kSharedCorePollSeconds.
double poll_before_sleep_seconds();

// Collective over `world`: picks the window as the header says, from this node's rank count and
// online CPUs, or from RLFUSION_WAIT_POLL_SECONDS. Throws ConfigError (on every rank) for an
// unreadable RLFUSION_WAIT_POLL_SECONDS.
void choose_wait_policy(MPI_Comm world);

// One line for logs: the window and why it was chosen.
std::string describe_wait_policy();

// The choice itself, for tests: a parsed override wins; otherwise ranks on their own cores poll
// without end.
double wait_poll_window(int ranks_on_node, int online_cpus, const char* override_text);

}  // namespace rlf
