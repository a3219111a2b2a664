#include <gtest/gtest.h>

#include "src/model/lr_schedule.h"

namespace rlf {

TEST(LearningRateSchedule, WarmsUpLinearlyThenDecaysToTheFloor) {
  EXPECT_FLOAT_EQ(cosine_learning_rate(1.0f, 1, 10, 100, 0.1f), 0.1f);
  EXPECT_FLOAT_EQ(cosine_learning_rate(1.0f, 10, 10, 100, 0.1f), 1.0f);
  EXPECT_NEAR(cosine_learning_rate(1.0f, 55, 10, 100, 0.1f), 0.55f, 1e-6);  // half way: mean
  EXPECT_FLOAT_EQ(cosine_learning_rate(1.0f, 100, 10, 100, 0.1f), 0.1f);
  EXPECT_FLOAT_EQ(cosine_learning_rate(2.0f, 1, 0, 1, 0.5f), 2.0f * 0.5f);  // one step, no warm-up
  float previous = 2.0f;
  for (int step = 10; step <= 100; ++step) {
    const float lr = cosine_learning_rate(1.0f, step, 10, 100, 0.1f);
    EXPECT_LE(lr, previous);
    previous = lr;
  }
}

}  // namespace rlf
