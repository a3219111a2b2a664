#include "src/rl/evaluation.h"

#include <algorithm>
#include <chrono>

#include "src/model/generation.h"
#include "src/rl/tokenizer.h"

namespace rlf {

Evaluation evaluate(Transformer<float>& model, const Task& task, int prompts, int batch) {
  const auto start = std::chrono::steady_clock::now();
  GenerationSettings greedy;
  greedy.temperature = 0.0f;
  greedy.eos_token = Tokenizer::kEos;
  greedy.max_new_tokens = task.max_response_chars() + 1;
  Evaluation result;
  double reward_sum = 0;
  for (int first = 0; first < prompts; first += batch) {
    const int count = std::min(batch, prompts - first);
    std::vector<TaskSample> samples;
    std::vector<std::vector<int>> tokens;
    std::vector<int64_t> ids;
    for (int i = 0; i < count; ++i) {
      samples.push_back(task.heldout_sample(first + i));
      std::vector<int> prompt{Tokenizer::kBos};
      const std::vector<int> text = Tokenizer::encode(samples.back().prompt);
      prompt.insert(prompt.end(), text.begin(), text.end());
      tokens.push_back(std::move(prompt));
      ids.push_back(samples.back().id);
    }
    const auto generated = generate(model, tokens, ids, greedy);
    for (int i = 0; i < count; ++i) {
      const double reward =
          task.reward(samples[size_t(i)], Tokenizer::decode(generated[size_t(i)].tokens));
      reward_sum += reward;
      result.correct += reward >= 1.0;
      result.generated_tokens += int64_t(generated[size_t(i)].tokens.size());
    }
    result.prompts += count;
  }
  result.mean_reward = result.prompts ? reward_sum / result.prompts : 0.0;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace rlf
