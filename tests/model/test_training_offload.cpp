// RL Fusion's offload (src/runtime/training_offload.h): the training state leaves the device
// arena during generation and comes back in place, bit for bit, so training continues exactly
// as if it had never left.
#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>
#include <vector>

#include "kernels/arena.h"
#include "src/model/optimizer.h"
#include "src/model/transformer.h"
#include "src/runtime/training_offload.h"
#include "tests/test_util.h"
#include "tests/tiny_policy.h"

namespace rlf {
namespace {

// One optimizer step on a fixed random gradient (stands in for a training step).
void step_with_gradient(Transformer<float>& model, AdamW<float>& optimizer, uint64_t seed) {
  const std::vector<float> g = test::random_vector<float>(size_t(model.parameter_count()), seed);
  std::memcpy(model.gradients(), g.data(), g.size() * sizeof(float));
  optimizer.step();
}

std::vector<float> copy_of(const float* p, int64_t n) {
  return {p, p + n};
}

TEST(TrainingOffload, RoundTripLeavesParametersAndOptimizerStateBitIdentical) {
  const ModelConfig config = test::tiny_policy_config();
  Arena device("device", 16 << 20), reference_device("reference", 16 << 20);
  Transformer<float> model(config, cpu_ops(), device, /*with_gradients=*/false);
  Transformer<float> plain(config, cpu_ops(), reference_device, /*with_gradients=*/true);
  model.initialize(3);
  plain.initialize(3);
  const Arena::Mark before_gradients = device.mark();
  model.allocate_gradients();
  AdamW<float> optimizer(model, AdamWHyper{}, 1.0f), plain_optimizer(plain, AdamWHyper{}, 1.0f);
  const int64_t n = model.parameter_count();
  Arena host("host", TrainingOffload::host_bytes(n));
  TrainingOffload offload(model, optimizer, before_gradients, host);
  EXPECT_GE(offload.device_bytes(), 3 * size_t(n) * sizeof(float));

  for (int step = 0; step < 3; ++step) {
    step_with_gradient(model, optimizer, 10 + step);
    step_with_gradient(plain, plain_optimizer, 10 + step);
    const auto params = copy_of(model.parameters(), n);
    const auto m = copy_of(optimizer.first_moment(), n);
    const auto v = copy_of(optimizer.second_moment(), n);
    const size_t used = device.used();
    EXPECT_EQ(offload.offload(), 2 * size_t(n) * sizeof(float));
    EXPECT_TRUE(offload.offloaded());
    EXPECT_EQ(device.used(), used - offload.device_bytes());
    {
      // Generation reuses the freed memory (and scribbles over it).
      ArenaScope generation(device);
      float* kv = device.allocate<float>(offload.device_bytes() / sizeof(float), "kv cache");
      std::memset(kv, 0x7f, offload.device_bytes());
    }
    offload.onload();
    EXPECT_EQ(device.used(), used);
    EXPECT_EQ(0, std::memcmp(model.parameters(), params.data(), size_t(n) * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(optimizer.first_moment(), m.data(), size_t(n) * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(optimizer.second_moment(), v.data(), size_t(n) * sizeof(float)));
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(model.gradients()[i], 0.0f) << i;
  }
  // Training continued exactly as without offload.
  EXPECT_EQ(0, std::memcmp(model.parameters(), plain.parameters(), size_t(n) * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(optimizer.second_moment(), plain_optimizer.second_moment(),
                           size_t(n) * sizeof(float)));
}

TEST(TrainingOffload, StateThatIsNotOnTopOrMemoryLeftAllocatedIsRefused) {
  const ModelConfig config = test::tiny_policy_config();
  Arena device("device", 16 << 20);
  Transformer<float> model(config, cpu_ops(), device, /*with_gradients=*/false);
  model.initialize(3);
  const Arena::Mark before_gradients = device.mark();
  model.allocate_gradients();
  AdamW<float> optimizer(model, AdamWHyper{}, 1.0f);
  Arena host("host", TrainingOffload::host_bytes(model.parameter_count()));
  TrainingOffload offload(model, optimizer, before_gradients, host);
  {
    ArenaScope later(device);
    device.allocate<float>(16, "something after the optimizer");
    EXPECT_THROW(offload.offload(), std::logic_error);
  }
  EXPECT_THROW(offload.onload(), std::logic_error);  // not offloaded
  offload.offload();
  EXPECT_THROW(offload.offload(), std::logic_error);  // twice
  device.allocate<float>(16, "left behind by generation");
  EXPECT_THROW(offload.onload(), std::logic_error);
  // Gradients below something else cannot be freed by one rewind.
  Arena other("other", 16 << 20);
  Transformer<float> with_gradients(config, cpu_ops(), other, /*with_gradients=*/true);
  const Arena::Mark after_gradients = other.mark();
  AdamW<float> other_optimizer(with_gradients, AdamWHyper{}, 1.0f);
  EXPECT_THROW(TrainingOffload(with_gradients, other_optimizer, after_gradients, host),
               std::logic_error);
}

}  // namespace
}  // namespace rlf
