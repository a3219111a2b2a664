// The CUDA emulator's scheduler (see emulator.h): blocks one after another, the threads of a block
// as fibers switched by a few lines of x86-64 assembly (no system call per switch, unlike
// swapcontext), released from barriers when every thread or lane concerned has arrived.
#include "kernels/cuda/emulator.h"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#if !defined(__x86_64__)
#error "the CUDA emulator's fiber switch is written for x86-64"
#endif

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define RLF_EMU_ASAN 1
#endif

// rlf_emu_switch(void** save_sp, void* load_sp): pushes the callee-saved registers and the
// floating-point control words, saves the stack pointer, loads the other one, restores, returns
// into the other context.
asm(R"(
.text
.globl rlf_emu_switch
.type rlf_emu_switch,@function
rlf_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size rlf_emu_switch, .-rlf_emu_switch
.section .note.GNU-stack,"",@progbits
.text
)");

extern "C" void rlf_emu_switch(void** save_sp, void* load_sp);

namespace rlf::emu {

dim3 g_thread_idx, g_block_idx, g_block_dim, g_grid_dim;

namespace {

constexpr size_t kStackBytes = 256 * 1024;  // kernels keep small per-thread arrays on it
constexpr int kWarp = 32;

enum class State { Ready, BlockBarrier, WarpBarrier, Done };

struct Fiber {
  void* sp = nullptr;
  State state = State::Ready;
  dim3 idx;
  uint64_t slot = 0;  // published value of a lane exchange
};

struct Runtime {
  std::vector<std::unique_ptr<char[]>> stacks;
  std::vector<Fiber> fibers;
  void* scheduler_sp = nullptr;
  int current = -1;
  const std::function<void()>* body = nullptr;
  std::vector<unsigned char> shared;
  uint64_t launches = 0;
  bool running = false;
  std::string fiber_error;  // an error met inside a fiber, thrown by the scheduler
#if defined(RLF_EMU_ASAN)
  void* fake_stack = nullptr;
  const void* scheduler_bottom = nullptr;
  size_t scheduler_size = 0;
#endif
};

Runtime& rt() {
  static Runtime r;
  return r;
}

[[noreturn]] void fail(const std::string& what) {
  throw std::logic_error("CUDA emulator: " + what + " (block " + std::to_string(g_block_idx.x) +
                         "," + std::to_string(g_block_idx.y) + "," + std::to_string(g_block_idx.z) +
                         ")");
}

// From a fiber back to the scheduler.
void yield_to_scheduler(State state) {
  Runtime& r = rt();
  Fiber& f = r.fibers[size_t(r.current)];
  f.state = state;
#if defined(RLF_EMU_ASAN)
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(state == State::Done ? nullptr : &fake, r.scheduler_bottom,
                                 r.scheduler_size);
  rlf_emu_switch(&f.sp, r.scheduler_sp);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  rlf_emu_switch(&f.sp, r.scheduler_sp);
#endif
}

void fiber_main() {
  Runtime& r = rt();
#if defined(RLF_EMU_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &r.scheduler_bottom, &r.scheduler_size);
#endif
  (*r.body)();
  yield_to_scheduler(State::Done);
  std::abort();  // a finished fiber is never resumed
}

// A fresh stack whose first switch-in "returns" into fiber_main with the ABI's alignment.
void* initial_stack(char* base, size_t bytes) {
  uintptr_t top = (reinterpret_cast<uintptr_t>(base) + bytes) & ~uintptr_t(15);
  auto* sp = reinterpret_cast<uint64_t*>(top);
  *--sp = 0;                                        // fake return address of fiber_main
  *--sp = reinterpret_cast<uint64_t>(&fiber_main);  // where rlf_emu_switch returns to
  for (int i = 0; i < 6; ++i) *--sp = 0;            // rbp rbx r12 r13 r14 r15
  uint32_t mxcsr = 0;
  uint16_t fpcw = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpcw));
  *--sp = uint64_t(mxcsr) | (uint64_t(fpcw) << 32);  // the host thread's settings (FTZ, DAZ)
  return sp;
}

void run_block(int threads, bool descending) {
  Runtime& r = rt();
  for (int t = 0; t < threads; ++t) {
    Fiber& f = r.fibers[size_t(t)];
    f.state = State::Ready;
    const unsigned bx = g_block_dim.x, by = g_block_dim.y;
    f.idx = dim3(unsigned(t) % bx, (unsigned(t) / bx) % by, unsigned(t) / (bx * by));
#if defined(RLF_EMU_ASAN)
    // A finished fiber leaves its last frames (fiber_main's) poisoned: start from a clean stack.
    ASAN_UNPOISON_MEMORY_REGION(r.stacks[size_t(t)].get(), kStackBytes);
#endif
    f.sp = initial_stack(r.stacks[size_t(t)].get(), kStackBytes);
  }
  for (;;) {
    for (int i = 0; i < threads; ++i) {
      const int t = descending ? threads - 1 - i : i;
      Fiber& f = r.fibers[size_t(t)];
      if (f.state != State::Ready) continue;
      r.current = t;
      g_thread_idx = f.idx;
#if defined(RLF_EMU_ASAN)
      __sanitizer_start_switch_fiber(&r.fake_stack, r.stacks[size_t(t)].get(), kStackBytes);
      rlf_emu_switch(&r.scheduler_sp, f.sp);
      __sanitizer_finish_switch_fiber(r.fake_stack, nullptr, nullptr);
#else
      rlf_emu_switch(&r.scheduler_sp, f.sp);
#endif
    }
    r.current = -1;
    if (!r.fiber_error.empty()) {
      const std::string what = r.fiber_error;
      r.fiber_error.clear();
      fail(what);
    }
    int done = 0, at_block = 0;
    for (int t = 0; t < threads; ++t) {
      done += r.fibers[size_t(t)].state == State::Done;
      at_block += r.fibers[size_t(t)].state == State::BlockBarrier;
    }
    if (done == threads) return;
    bool released = false;
    for (int w = 0; w * kWarp < threads; ++w) {
      const int first = w * kWarp, last = std::min(threads, first + kWarp);
      int waiting = 0;
      for (int t = first; t < last; ++t) waiting += r.fibers[size_t(t)].state == State::WarpBarrier;
      if (waiting == 0) continue;
      if (waiting != last - first) {
        fail("warp " + std::to_string(w) +
             ": a shuffle or __syncwarp() that not every lane of the warp reached");
      }
      for (int t = first; t < last; ++t) r.fibers[size_t(t)].state = State::Ready;
      released = true;
    }
    if (released) continue;
    if (at_block + done != threads) fail("threads wait at barriers that can never be released");
    if (done > 0) {
      fail("__syncthreads() after " + std::to_string(done) + " of " + std::to_string(threads) +
           " threads returned");
    }
    for (int t = 0; t < threads; ++t) r.fibers[size_t(t)].state = State::Ready;
  }
}

Fiber& current_fiber(const char* what) {
  Runtime& r = rt();
  if (r.current < 0) fail(std::string(what) + " outside a kernel");
  return r.fibers[size_t(r.current)];
}

}  // namespace

void launch(dim3 grid, dim3 block, size_t dynamic_shared_bytes, const std::function<void()>& body) {
  Runtime& r = rt();
  if (r.running) throw std::logic_error("CUDA emulator: a launch inside a kernel");
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  if (threads == 0 || threads > 1024) {
    throw std::invalid_argument("CUDA emulator: " + std::to_string(threads) +
                                " threads per block (1 to 1024)");
  }
  if (block.z > 64) throw std::invalid_argument("CUDA emulator: block.z > 64");
  if (grid.y > 65535 || grid.z > 65535) {
    throw std::invalid_argument("CUDA emulator: grid.y or grid.z above 65535");
  }
  ++r.launches;
  if (uint64_t(grid.x) * grid.y * grid.z == 0) return;
  while (r.stacks.size() < threads) r.stacks.push_back(std::make_unique<char[]>(kStackBytes));
  if (r.fibers.size() < threads) r.fibers.resize(threads);
  r.body = &body;
  r.running = true;
  g_block_dim = block;
  g_grid_dim = grid;
  uint64_t block_number = 0;
  try {
    for (unsigned z = 0; z < grid.z; ++z) {
      for (unsigned y = 0; y < grid.y; ++y) {
        for (unsigned x = 0; x < grid.x; ++x) {
          g_block_idx = dim3(x, y, z);
          r.shared.assign(dynamic_shared_bytes, 0);
          run_block(int(threads), (block_number++ & 1) != 0);
        }
      }
    }
  } catch (...) {
    r.running = false;
    r.current = -1;
    throw;
  }
  r.running = false;
}

void syncthreads() {
  current_fiber("__syncthreads()");
  yield_to_scheduler(State::BlockBarrier);
}

void syncwarp() {
  current_fiber("__syncwarp()");
  yield_to_scheduler(State::WarpBarrier);
}

void* dynamic_shared() {
  return rt().shared.data();
}

int lane_id() {
  return rt().current % kWarp;
}

uint64_t exchange(uint64_t mine, int source_lane) {
  Runtime& r = rt();
  Fiber& f = current_fiber("a warp shuffle");
  f.slot = mine;
  yield_to_scheduler(State::WarpBarrier);
  const int threads = int(g_block_dim.x * g_block_dim.y * g_block_dim.z);
  const int source = (r.current / kWarp) * kWarp + source_lane;
  if (source_lane < 0 || source_lane >= kWarp || source >= threads) {
    // Exceptions cannot leave a fiber's stack: the scheduler throws it.
    r.fiber_error =
        "a shuffle reads lane " + std::to_string(source_lane) + ", which does not exist";
    yield_to_scheduler(State::Done);
  }
  const uint64_t got = r.fibers[size_t(source)].slot;
  yield_to_scheduler(State::WarpBarrier);
  return got;
}

uint64_t launches() {
  return rt().launches;
}

}  // namespace rlf::emu
