// The injected router skew (src/model/router_skew.h): the documented ramp, added to every row.
#include <gtest/gtest.h>

#include <vector>

#include "src/model/router_skew.h"

namespace rlf {
namespace {

TEST(RouterSkew, RampFallsFromExpertZeroBySkewOverTheExperts) {
  EXPECT_EQ(router_skew_bias(4, 3.0f), (std::vector<float>{0.0f, -1.0f, -2.0f, -3.0f}));
  EXPECT_EQ(router_skew_bias(3, 0.0f), (std::vector<float>{0.0f, 0.0f, 0.0f}));
  EXPECT_EQ(router_skew_bias(1, 5.0f), (std::vector<float>{0.0f}));
}

TEST(RouterSkew, AddsTheBiasToEveryRow) {
  std::vector<float> logits = {1, 1, 1, 2, 2, 2};  // [2, 3]
  add_router_bias(logits.data(), router_skew_bias(3, 4.0f), 2);
  EXPECT_EQ(logits, (std::vector<float>{1, -1, -3, 2, 0, -2}));
  std::vector<double> wide = {0, 0, 0};
  add_router_bias(wide.data(), router_skew_bias(3, 4.0f), 1);
  EXPECT_EQ(wide, (std::vector<double>{0, -2, -4}));
}

}  // namespace
}  // namespace rlf
