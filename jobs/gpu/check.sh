#!/usr/bin/env bash
# The GPU check: one command on a machine with an NVIDIA GPU, the CUDA toolkit, CMake and a C++
# compiler (no MPI, HDF5, Boost, TBB or GoogleTest needed; Eigen and GoogleTest come from
# .gpu-deps/, made here by jobs/gpu/fetch-deps.sh and carried along). It
#   1. configures the kernels-only build (RLFUSION_KERNELS_ONLY, CUDA required) and builds it;
#   2. runs the CUDA kernel tests (every op against the reference on the GPU and on the CUDA
#      emulator, the kernel-level end-to-end training steps against the CPU backend, device
#      selection) and the CPU kernel tests;
#   3. runs the GPU tests again under compute-sanitizer's memcheck and racecheck;
#   4. runs the kernels bench (GFLOP/s, GB/s, % of the measured GEMM and copy peaks);
# and writes its logs to $OUT (or build-gpu/logs): summary.txt first. Sized for 6 minutes on
# 16 cores and one H200: each step has a time limit. Exit code 0 only if everything passed and
# the GPU tests really ran on the GPU (not skipped).
#
# Environment: BUILD (build folder, default build-gpu), JOBS (default 16), OUT (logs),
# CUDA_ARCHS (default 90: H100/H200), LIMIT_CONFIGURE / LIMIT_BUILD / LIMIT_TESTS /
# LIMIT_CPU_TESTS / LIMIT_MEMCHECK / LIMIT_RACECHECK / LIMIT_BENCH (seconds).
set -uo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD:-$root/build-gpu}
jobs=${JOBS:-16}
archs=${CUDA_ARCHS:-90}
out=${OUT:-$build/logs}
# Time limits of the steps (seconds), adding up to under 6 minutes on 16 cores (measured on an
# H200 with 16 cores: configure 10 s, build 16 s, tests 6 s, memcheck 2 s, racecheck 75 s, CPU
# tests 1 s, bench 12 s; on 2 cores: configure 8-12 s, build 110-219 s); raise them on smaller
# machines.
limit_configure=${LIMIT_CONFIGURE:-30}
limit_build=${LIMIT_BUILD:-60}
limit_tests=${LIMIT_TESTS:-30}
limit_cpu_tests=${LIMIT_CPU_TESTS:-20}
limit_bench=${LIMIT_BENCH:-45}
limit_memcheck=${LIMIT_MEMCHECK:-30}
limit_racecheck=${LIMIT_RACECHECK:-120}
mkdir -p "$out"
summary="$out/summary.txt"
: > "$summary"
t0=$(date +%s)
status=0

say() { echo "$*" | tee -a "$summary"; }
elapsed() { echo $(( $(date +%s) - t0 )); }
step() {  # step NAME LIMIT_SECONDS LOG COMMAND...
  local name=$1 limit=$2 logfile=$3
  shift 3
  local s=$(date +%s)
  timeout "$limit" "$@" >> "$logfile" 2>&1
  local rc=$?
  say "$(printf '%-22s rc=%-3s %4ss (at %ss)' "$name" "$rc" "$(( $(date +%s) - s ))" "$(elapsed)")"
  [ $rc -eq 124 ] && say "  ^ stopped at its ${limit}s limit"
  return $rc
}

[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
say "# rlfusion GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')"
if command -v nvidia-smi >/dev/null 2>&1; then
  say "# GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
else
  say "# GPU: nvidia-smi not found"
fi
say "# nvcc: $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo 'not found')," \
    "cmake $(cmake --version | head -1 | grep -o '[0-9][0-9.]*'), $(c++ --version | head -1)"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true

if [ ! -f "$root/.gpu-deps/usr/include/eigen3/Eigen/Core" ]; then
  say "no .gpu-deps/: run jobs/gpu/fetch-deps.sh where apt-get works, and carry .gpu-deps"
  [ -f /usr/include/eigen3/Eigen/Core ] || exit 2
fi

generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
log="$out/build.log"
: > "$log"
step configure "$limit_configure" "$log" cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DRLFUSION_KERNELS_ONLY=ON -DRLFUSION_REQUIRE_CUDA=ON -DRLFUSION_DEPS_DIR="$root/.gpu-deps" \
  -DCMAKE_CUDA_ARCHITECTURES="$archs" || { say "configure failed: see build.log"; exit 1; }
step build "$limit_build" "$log" cmake --build "$build" -j "$jobs" || {
  grep -E "error|Error" "$log" | head -20 >> "$summary"
  say "build failed: see build.log"
  exit 1
}

tests="$out/cuda_kernel_tests.log"
: > "$tests"
step cuda_kernel_tests "$limit_tests" "$tests" "$build/tests/kernels/cuda_kernel_tests" \
  --gtest_output="xml:$out/cuda_kernel_tests.xml" || status=1
# One line per test ends with its time, e.g. "[       OK ] Suite.Name/gpu (12 ms)".
count() { grep -cE "^\[ *$1 *\] .* \([0-9]+ ms\)\$" "$tests"; }
passed=$(count OK)
skipped=$(count SKIPPED)
failed=$(count FAILED)
gpu_ran=$(grep -cE '^\[ +OK \] .*/gpu \([0-9]+ ms\)$' "$tests")
say "  passed $passed (on the GPU: $gpu_ran), skipped $skipped, failed $failed"
grep -m1 "no usable CUDA GPU" "$tests" | sed 's/^/  skip reason: /' >> "$summary"
grep -E '^\[  FAILED  \] .* \([0-9]+ ms\)$' "$tests" >> "$summary"
if [ "$gpu_ran" -eq 0 ]; then
  say "  NO TEST RAN ON THE GPU (skipped: see the reason above)"
  status=1
fi

# compute-sanitizer over the GPU tests: memcheck (out-of-bounds and misaligned accesses, in global
# and shared memory) and racecheck (shared-memory hazards between a block's threads). Its first
# run on an H200 found a shared-memory read past the decode kernel's buffer, which the tests'
# results could not show.
sanitizer=$(command -v compute-sanitizer || true)
if [ -n "$sanitizer" ]; then
  for tool in memcheck racecheck; do
    log_tool="$out/$tool.log"
    : > "$log_tool"
    limit_tool=$limit_memcheck
    [ "$tool" = racecheck ] && limit_tool=$limit_racecheck
    step "$tool" "$limit_tool" "$log_tool" "$sanitizer" --tool "$tool" --error-exitcode 3 \
      "$build/tests/kernels/cuda_kernel_tests" --gtest_filter='*/gpu' || status=1
    say "  $(grep -m1 -E '(ERROR|RACECHECK) SUMMARY' "$log_tool" | sed 's/^=* *//')" \
        "$(grep -E '^\[  (PASSED|FAILED)  \]' "$log_tool" | head -1)"
  done
else
  say "compute-sanitizer not found: memory and race checks not run"
fi

cpu_tests="$out/kernel_tests.log"
: > "$cpu_tests"
step kernel_tests "$limit_cpu_tests" "$cpu_tests" "$build/tests/kernels/kernel_tests" || status=1
say "  $(grep -E '^\[  (PASSED|FAILED)  \]' "$cpu_tests" | head -2 | tr '\n' ' ')"

bench="$out/bench.txt"
: > "$bench"
if step bench "$limit_bench" "$bench" "$build/kernels/rlfusion-kernels-bench" --json; then
  grep -v '^{' "$bench" | sed -n '/^# op/,$p' >> "$summary"
else
  status=1
  tail -5 "$bench" | sed 's/^/  /' >> "$summary"
fi

say "# total $(elapsed)s, $([ $status -eq 0 ] && echo PASS || echo FAIL)"
exit $status
