// AdamW over a model's flat parameter buffer, with global-norm clipping. The moments live in the
// same device arena as the parameters (RL Fusion later offloads them to host memory).
#pragma once

#include "kernels/adamw.h"
#include "src/model/transformer.h"

namespace rlf {

template <typename T>
class AdamW {
 public:
  AdamW(Transformer<T>& model, const AdamWHyper& hyper, float max_grad_norm);

  // Clips, updates the parameters, and returns the gradient norm before clipping.
  double step();
  int steps_taken() const { return step_; }
  T* first_moment() const { return m_; }
  T* second_moment() const { return v_; }
  AdamWHyper& hyper() { return hyper_; }

 private:
  Transformer<T>& model_;
  AdamWHyper hyper_;
  float max_grad_norm_;
  T* m_;
  T* v_;
  int step_ = 0;
};

}  // namespace rlf
