// Labelled samples for the learned reward model (src/rl/verifier_samples.h): a pure function of
// (seed, index), labels that agree with the task's own check, both classes present, corruptions
// of every kind, and training and held-out sets that differ.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "src/rl/task.h"
#include "src/rl/tokenizer.h"
#include "src/rl/verifier_samples.h"

namespace rlf {
namespace {

std::unique_ptr<Task> shipped(const std::string& name, uint64_t seed) {
  return make_task(
      load_task_config(std::string(RLFUSION_SOURCE_DIR) + "/inputs/tasks/" + name + ".ini", seed));
}

TEST(VerifierSamples, CorruptionsNeverEqualTheAnswerAndCoverEveryKind) {
  bool changed = false, swapped = false, truncated = false;
  for (int64_t id = 0; id < 300; ++id) {
    const std::string answer = "0123345";
    const std::string bad = corrupt_answer(answer, 9, id);
    ASSERT_NE(bad, answer) << id;
    EXPECT_EQ(bad, corrupt_answer(answer, 9, id));
    if (bad.size() < answer.size()) truncated = true;
    if (bad.size() == answer.size()) {
      std::multiset<char> a(answer.begin(), answer.end()), b(bad.begin(), bad.end());
      (a == b ? swapped : changed) = true;
    }
  }
  EXPECT_TRUE(changed && swapped && truncated);
  EXPECT_NE(corrupt_answer("7", 9, 1), "7");
  EXPECT_NE(corrupt_answer("", 9, 1), "");
}

TEST(VerifierSamples, LabelsFollowTheTasksCheckAndBothClassesAppear) {
  for (const char* name : {"sort", "add"}) {
    const auto task = shipped(name, 3);
    int positives = 0;
    const int n = 400;
    for (int64_t i = 0; i < n; ++i) {
      const LabelledSample s = labelled_sample(*task, i, /*heldout=*/false, 3);
      const TaskSample sample = task->train_sample(i);
      // <bos> prompt answer <eos>: the answer is what lies between the prompt and <eos>.
      ASSERT_GE(s.tokens.size(), sample.prompt.size() + 2);
      EXPECT_EQ(s.tokens.front(), Tokenizer::kBos);
      EXPECT_EQ(s.tokens.back(), Tokenizer::kEos);
      const std::vector<int> answer_tokens(s.tokens.begin() + 1 + long(sample.prompt.size()),
                                           s.tokens.end() - 1);
      const std::string answer = Tokenizer::decode(answer_tokens);
      EXPECT_EQ(s.label, task->correct(sample, answer) ? 1.0f : 0.0f) << name << " " << i;
      positives += s.label > 0.5f;
      const LabelledSample again = labelled_sample(*task, i, false, 3);
      EXPECT_EQ(again.tokens, s.tokens);
    }
    // Half the draws keep the reference answer; a corruption is never correct on these tasks.
    EXPECT_GT(positives, n * 4 / 10) << name;
    EXPECT_LT(positives, n * 6 / 10) << name;
  }
}

TEST(VerifierSamples, HeldOutSamplesAreNotTrainingSamples) {
  const auto task = shipped("sort", 3);
  int same = 0;
  for (int64_t i = 0; i < 50; ++i) {
    same += labelled_sample(*task, i, true, 3).tokens == labelled_sample(*task, i, false, 3).tokens;
  }
  EXPECT_LT(same, 10);
}

}  // namespace
}  // namespace rlf
