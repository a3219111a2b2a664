// RL Fusion's offload: during a generation phase the training-only state leaves the device arena,
// so the generation state (KV cache, a generation-layout model) can use its memory.
//
// The state is the top of the device arena: the model's gradients, then AdamW's two moments,
// allocated in that order after `mark` and nothing after them. offload() copies the moments into
// the host arena (the gradients are scratch between steps: every minibatch zeroes them first)
// and rewinds the device arena to `mark`. onload() allocates the same buffers again, which a
// stack arena puts at the same addresses (checked), copies the moments back and zeroes the
// gradients. A train -> offload -> onload round trip leaves parameters and optimizer state bit
// for bit as they were.
#pragma once

#include <cstdint>

#include "kernels/arena.h"
#include "src/model/optimizer.h"
#include "src/model/transformer.h"

namespace rlf {

class TrainingOffload {
 public:
  // Throws std::logic_error unless the gradients and moments are the device arena's last
  // allocations, starting at `mark`. `host` must hold the two moments.
  TrainingOffload(Transformer<float>& model, AdamW<float>& optimizer, Arena::Mark mark,
                  Arena& host);
  ~TrainingOffload();
  TrainingOffload(const TrainingOffload&) = delete;
  TrainingOffload& operator=(const TrainingOffload&) = delete;

  // Device bytes offload frees (gradients and moments, alignment included).
  size_t device_bytes() const { return top_ - mark_; }
  // Host bytes the moments need (what `host` must hold).
  static size_t host_bytes(int64_t parameters);
  bool offloaded() const { return offloaded_; }

  // Returns the bytes copied device -> host. Throws std::logic_error if anything was allocated
  // after the optimizer state, or if it is offloaded already.
  uint64_t offload();
  // Returns the bytes copied host -> device.
  uint64_t onload();

 private:
  Transformer<float>& model_;
  AdamW<float>& optimizer_;
  Arena& device_;
  Arena& host_;
  Arena::Mark mark_, top_, host_mark_ = 0;
  float* saved_m_ = nullptr;
  float* saved_v_ = nullptr;
  bool offloaded_ = false;
};

}  // namespace rlf
