#include "src/rl/sft.h"

#include <vector>

#include "kernels/arena.h"
#include "src/model/sequence_loss.h"
#include "src/rl/tokenizer.h"

namespace rlf {

SftStep sft_step(Transformer<float>& model, AdamW<float>& optimizer, const Task& task,
                 int64_t first_prompt, int batch) {
  std::vector<int> inputs, targets, offsets{0};
  std::vector<float> weights;
  int answer_tokens = 0;
  for (int i = 0; i < batch; ++i) {
    const TaskSample sample = task.train_sample(first_prompt + i);
    std::vector<int> sequence{Tokenizer::kBos};
    const std::vector<int> prompt = Tokenizer::encode(sample.prompt);
    sequence.insert(sequence.end(), prompt.begin(), prompt.end());
    const size_t answer_start = sequence.size();
    const std::vector<int> answer = Tokenizer::encode(sample.answer);
    sequence.insert(sequence.end(), answer.begin(), answer.end());
    sequence.push_back(Tokenizer::kEos);
    for (size_t t = 0; t + 1 < sequence.size(); ++t) {
      inputs.push_back(sequence[t]);
      targets.push_back(sequence[t + 1]);
      const bool is_answer = t + 1 >= answer_start;
      weights.push_back(is_answer ? 1.0f : 0.0f);
      answer_tokens += is_answer;
    }
    offsets.push_back(int(inputs.size()));
  }
  for (float& w : weights) w /= float(answer_tokens);

  const int N = int(inputs.size()), V = model.config().vocab_size;
  model.zero_gradients();
  const float* logits = model.forward(inputs.data(), offsets.data(), batch);
  float* dlogits = model.device().allocate_zeroed<float>(size_t(N) * V, "loss gradient");
  SftStep step;
  step.loss = weighted_nll(model.ops(), model.device(), logits, targets.data(), weights.data(), N,
                           V, dlogits);
  model.backward(dlogits, model.config().aux_loss_coef);
  step.grad_norm = optimizer.step();
  step.tokens = N;
  return step;
}

}  // namespace rlf
