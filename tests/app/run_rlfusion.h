// Runs the rlfusion binary the way a user does, from the source tree (where inputs/ lives), and
// captures its exit code and output (stdout and stderr together).
#pragma once

#include <sys/wait.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace rlf::test {

struct CommandResult {
  int exit_code;
  std::string output;
};

// The environment of every command the tests launch (one host, shared memory only). Open MPI's
// start-up dominates these short runs: a 4-rank launch of `rlfusion --help` took 0.70 s and 0.86
// CPU s on this VM, and an 8-step 4-rank train run 1.5 CPU s in all. Naming the transport the
// tests get anyway (the ob1 PML over shared memory) skips the cm PML's probe of PSM hardware
// (0.2 s asleep in every process) and the TCP BTL's set-up, and leaving hwloc's I/O discovery
// out skips its reads of every PCI device's configuration; the CPU and memory topology, which
// binding needs, is still discovered. Measured on 10 launches each: 4 ranks 0.70 -> 0.36-0.44 s
// and 0.86 -> 0.54-0.70 CPU s, a singleton 0.46 -> 0.23 s.
inline constexpr const char* kTestLaunchEnvironment =
    "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=ob1 "
    "OMPI_MCA_btl=self,vader "
    "HWLOC_COMPONENTS=-pci,-linuxio,-opencl,-cuda,-nvml,-rsmi,-levelzero,-gl";

// A shell command line run from the source tree, e.g. a job script; RLFUSION names the binary.
inline CommandResult run_in_source_tree(const std::string& command_line) {
  const std::string command = std::string("cd " RLFUSION_SOURCE_DIR " && export ") +
                              kTestLaunchEnvironment + " && RLFUSION=" RLFUSION_BINARY " " +
                              command_line + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  std::string output;
  std::array<char, 4096> buffer;
  while (size_t n = fread(buffer.data(), 1, buffer.size(), pipe)) output.append(buffer.data(), n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

// ranks == 0: the binary alone (a singleton MPI world); otherwise under mpiexec with that many
// ranks, oversubscribed (these tests check results and counts, never times). `environment`:
// extra VAR=value words for the launcher.
inline CommandResult run_rlfusion(const std::string& args, int ranks = 0,
                                  const std::string& environment = "") {
  const std::string launcher =
      ranks > 0 ? "mpiexec -n " + std::to_string(ranks) + " --oversubscribe " : std::string();
  return run_in_source_tree(environment + " " + launcher + RLFUSION_BINARY " " + args);
}

struct RlfusionRun {
  std::string args;
  int ranks = 0;
};

// Every run of `runs` (as run_rlfusion), `concurrency` at a time; results in the order of `runs`.
// For the many short runs of the bad-input tests: each spends most of its second waiting on
// MPI's start-up (the launcher, the daemon, the wire-up), not computing, so a few at once take a
// fraction of the time one after another does. Plain threads, not oneTBB: each one blocks in
// popen.
inline std::vector<CommandResult> run_rlfusion_concurrently(const std::vector<RlfusionRun>& runs,
                                                            int concurrency = 4) {
  std::vector<CommandResult> results(runs.size());
  std::atomic<size_t> next{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < concurrency; ++w) {
    workers.emplace_back([&] {
      for (size_t i = next++; i < runs.size(); i = next++) {
        results[i] = run_rlfusion(runs[i].args, runs[i].ranks);
      }
    });
  }
  for (std::thread& worker : workers) worker.join();
  return results;
}

}  // namespace rlf::test
