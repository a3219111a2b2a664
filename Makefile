# rlfusion top-level driver. `make run` and `make test` each work alone on a fresh Debian/Ubuntu
# machine: they install missing packages (make deps), configure, build, then run.
BUILD      ?= build
BUILD_TYPE ?= Release
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
# `make test` runs one test more than the cores: the end-to-end tests spend much of their time
# waiting on MPI start-up rather than computing (2 cores: the suite took 498 s at -j3 against
# 572-577 s at -j2; no test asserts a time).
TEST_JOBS  ?= $(shell echo $$(( $(JOBS) + 1 )))
CMAKE_ARGS ?=

ifeq ($(NATIVE),1)
  ARCH_FLAGS := -march=native
else ifeq ($(PORTABLE),1)
  ARCH_FLAGS :=
else
  ARCH_FLAGS := -march=x86-64-v3
endif

# Open MPI refuses root without these (containers, CI); harmless otherwise.
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1

RLFUSION := $(BUILD)/src/rlfusion
MPIEXEC  ?= mpiexec
# Ranks of the default job: an actor and a learner, each on its own core, where there are two.
RANKS    ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -ge 2 ] && echo 2 || echo 1)

.PHONY: all deps configure build run test test-asan test-fuzz test-slurm install plots bench clean
.PHONY: format

all: build

deps:
	@jobs/setup/install-deps.sh

$(BUILD)/build.ninja:
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) \
	  "-DRLFUSION_ARCH_FLAGS=$(ARCH_FLAGS)" $(CMAKE_ARGS)

configure: $(BUILD)/build.ninja

build: deps configure
	@cmake --build $(BUILD) -j $(JOBS)

# The main job at its default: SFT warm start of the tiny MoE policy, then RL with RL Fusion and
# StaleSync on 2 ranks after a synchronous disaggregated baseline (an actor and a learner on two
# virtual nodes) in the same job, ending with the speed-up. One core: the same RL, synchronous,
# on one rank.
ONE_RANK_RUN := $(if $(filter 1,$(RANKS)),--mode disaggregated --staleness 0 --baseline none)
run: build
	$(MPIEXEC) -n $(RANKS) --bind-to core $(RLFUSION) train --config inputs/runs/default.ini $(ONE_RANK_RUN)

test: build
	@cd $(BUILD) && ctest -j $(TEST_JOBS) --output-on-failure --timeout 600

# Unit tests under AddressSanitizer + UndefinedBehaviorSanitizer (a separate build tree that builds
# only the unit-test executables). The ActivationPeak tests run the `small` model's code paths
# that the other unit tests cover at smaller sizes; under the sanitizers they take 5 CPU minutes,
# so only `make test` runs them. No nvcc here (RLFUSION_CUDA=OFF, as in test-fuzz): `make test`
# builds the CUDA kernels once, and their emulated twins (tests/kernels/cuda) run under the
# sanitizers all the same. -Og with line tables only (-g1: file and line in every report, no
# variable info): -O1 -g1 already compiled the tree about twice as fast as -O2 -g
# (src/app/fused_train.cpp: 10.8 vs 22.8 CPU s), and -Og compiles it in half of -O1's time again
# (6.7 vs 12.1 s) while the instrumented tests run no slower; measured back to back on this
# machine, the whole `make test-asan`: 345 s at -O1, 239 s at -Og (tests 19.3 and 16.7 s).
ASAN_OPT_FLAGS ?= -Og -g1 -DNDEBUG
test-asan: deps
	@cmake -S . -B $(BUILD)-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRLFUSION_CUDA=OFF \
	  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=$(ASAN_OPT_FLAGS)" -DRLFUSION_SANITIZE=ON \
	  "-DRLFUSION_ARCH_FLAGS=$(ARCH_FLAGS)" $(CMAKE_ARGS) >/dev/null
	@cmake --build $(BUILD)-asan -j $(JOBS) --target unit_tests
	@cd $(BUILD)-asan && ctest -j $(JOBS) -L unit -E '^ActivationPeak\.' --output-on-failure --timeout 900

# libFuzzer targets for the checkpoint and trace validation layers (tests/fuzz), a fixed number
# of runs from a fixed seed; clang and its fuzzer runtime are installed when missing.
# Runs per target (the checkpoint target writes and reads a file per run: ~200 runs/s).
FUZZ_RUNS ?= fuzz_trace_report:200000 fuzz_checkpoint:3000
FUZZ_TARGETS := fuzz_trace_report fuzz_checkpoint
test-fuzz:
	@jobs/setup/install-deps.sh clang libclang-rt-14-dev
	@cmake -S . -B $(BUILD)-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DRLFUSION_FUZZ=ON -DRLFUSION_CUDA=OFF \
	  "-DRLFUSION_ARCH_FLAGS=$(ARCH_FLAGS)" $(CMAKE_ARGS) >/dev/null
	@cmake --build $(BUILD)-fuzz -j $(JOBS) --target $(FUZZ_TARGETS)
	@cd $(BUILD)-fuzz && for entry in $(FUZZ_RUNS); do \
	  t=$${entry%%:*}; runs=$${entry#*:}; \
	  echo "fuzzing $$t: $$runs runs, seed 1 (log: $(BUILD)-fuzz/$$t.log)"; \
	  tests/fuzz/$$t -runs=$$runs -seed=1 -max_len=512 -print_final_stats=1 \
	    -artifact_prefix=$$t- 2>$$t.log || { tail -40 $$t.log; exit 1; }; \
	  grep -E "^Done" $$t.log; \
	done

# PNG plots of a run directory (jobs/plot/plot_run.py): throughput per step, time per rank and
# the phase timeline, next to its trace. RUN=runs/default by default.
RUN ?= runs/default
plots: build
	@jobs/setup/install-deps.sh python3-h5py python3-matplotlib
	@/usr/bin/python3 jobs/plot/plot_run.py $(RUN) --rlfusion $(RLFUSION)
# Installs the binary, inputs, job scripts, docs and the Lmod modulefile under PREFIX
# (module use $(PREFIX)/share/modulefiles; module load rlfusion). docs/CLUSTER.md.
PREFIX ?= /usr/local
install: build
	@cmake --install $(BUILD) --prefix $(PREFIX)

# A real single-node Slurm (munge, slurmctld, slurmd from Debian) started in a temporary folder:
# the job scripts installed and loaded with Lmod, a job stopped at its time limit by its signal
# (checkpoint, exit code 3), a chained job resuming it, a PBS script through Slurm's qsub; every
# daemon stopped at the end (tests/slurm/test_slurm.sh). Installs the packages it needs.
test-slurm: build
	@tests/slurm/test_slurm.sh $(BUILD)

# Every benchmark at its default. bench a2a needs 4 virtual nodes: 8 ranks, oversubscribed on a
# small machine (its emulated link time dominates the measurement; it prints the share). bench
# overlap, bench modes and bench pipeline time compute: one rank per core, never oversubscribed
# (bench modes and bench pipeline need 2 cores or more and are skipped below that).
bench: build
	$(RLFUSION) bench kernels
	$(MPIEXEC) -n $(RANKS) --bind-to core $(RLFUSION) bench queue
	$(MPIEXEC) -n 8 --oversubscribe $(RLFUSION) bench a2a --ranks-per-node 2
	$(MPIEXEC) -n $(RANKS) --bind-to core $(RLFUSION) bench overlap
	$(RLFUSION) bench checkpoint
	$(RLFUSION) bench balance
	@if [ $(RANKS) -ge 2 ]; then $(MPIEXEC) -n 2 --bind-to core $(RLFUSION) bench migration; \
	  else echo "bench migration skipped: needs 2 cores"; fi
	@if [ $(RANKS) -ge 2 ]; then $(MPIEXEC) -n 2 --bind-to core $(RLFUSION) bench modes; \
	  else echo "bench modes skipped: needs 2 cores"; fi
	@if [ $(RANKS) -ge 2 ]; then $(MPIEXEC) -n 2 --bind-to core $(RLFUSION) bench pipeline; \
	  else echo "bench pipeline skipped: needs 2 cores"; fi

format:
	@clang-format -i $$(git ls-files '*.cpp' '*.h')

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-fuzz
