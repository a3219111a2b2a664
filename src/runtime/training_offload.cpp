#include "src/runtime/training_offload.h"

#include <cstring>
#include <stdexcept>

#include "kernels/gpu.h"

namespace rlf {

TrainingOffload::TrainingOffload(Transformer<float>& model, AdamW<float>& optimizer,
                                 Arena::Mark mark, Arena& host)
    : model_(model),
      optimizer_(optimizer),
      device_(model.device()),
      host_(host),
      mark_(mark),
      top_(model.device().mark()) {
  // The gradients must be the first allocation after `mark` and the moments must end at the top:
  // otherwise rewinding would free something else.
  const bool ordered = model.gradients() && optimizer.first_moment() &&
                       static_cast<const void*>(model.gradients()) <
                           static_cast<const void*>(optimizer.first_moment()) &&
                       optimizer.first_moment() < optimizer.second_moment();
  // ... and fill [mark, top) exactly: three buffers of one parameter buffer each.
  const size_t a = Arena::kAlignment;
  const size_t buffer = (size_t(model.parameter_count()) * sizeof(float) + a - 1) / a * a;
  if (!ordered || mark_ >= top_ || top_ - mark_ != 3 * buffer) {
    throw std::logic_error(
        "TrainingOffload: gradients and optimizer moments must be the device arena's last "
        "allocations, in that order");
  }
}

TrainingOffload::~TrainingOffload() = default;

size_t TrainingOffload::host_bytes(int64_t parameters) {
  // Two moments, each rounded up to the arena's alignment.
  const size_t a = Arena::kAlignment;
  return 2 * ((size_t(parameters) * sizeof(float) + a - 1) / a * a);
}

uint64_t TrainingOffload::offload() {
  if (offloaded_) throw std::logic_error("TrainingOffload: already offloaded");
  if (device_.mark() != top_) {
    throw std::logic_error("TrainingOffload: something was allocated after the optimizer state");
  }
  const size_t n = size_t(model_.parameter_count());
  host_mark_ = host_.mark();
  saved_m_ = host_.allocate<float>(n, "offloaded first moment");
  saved_v_ = host_.allocate<float>(n, "offloaded second moment");
  // Streaming stores: the moments stay in host memory for the whole generation phase.
  copy_bytes_streaming(saved_m_, optimizer_.first_moment(), n * sizeof(float));
  copy_bytes_streaming(saved_v_, optimizer_.second_moment(), n * sizeof(float));
  device_.release(mark_);
  offloaded_ = true;
  return 2 * n * sizeof(float);
}

uint64_t TrainingOffload::onload() {
  if (!offloaded_) throw std::logic_error("TrainingOffload: not offloaded");
  if (device_.mark() != mark_) {
    throw std::logic_error("TrainingOffload: the generation phase left memory allocated");
  }
  const size_t n = size_t(model_.parameter_count());
  // The gradients come back zeroed with streaming stores: the step zeroes them again before its
  // first backward (memset's stores would read every line first, twice the traffic).
  float* grads = model_.allocate_gradients(Transformer<float>::Zeroing::Streaming);
  float* m = device_.allocate<float>(n, "optimizer first moment");
  float* v = device_.allocate<float>(n, "optimizer second moment");
  // A stack arena rewound to the same mark hands out the same addresses for the same requests;
  // AdamW keeps its pointers.
  if (m != optimizer_.first_moment() || v != optimizer_.second_moment() || device_.mark() != top_ ||
      grads == nullptr) {
    throw std::logic_error("TrainingOffload: the optimizer state did not come back in place");
  }
  // Streaming stores too: AdamW reads the moments only after the whole forward and backward.
  copy_bytes_streaming(m, saved_m_, n * sizeof(float));
  copy_bytes_streaming(v, saved_v_, n * sizeof(float));
  host_.release(host_mark_);
  offloaded_ = false;
  return 2 * n * sizeof(float);
}

}  // namespace rlf
