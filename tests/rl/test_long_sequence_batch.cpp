// The synthetic long-sequence batch of `bench queue`: a pure function of (shape, seed), lengths
// lognormal around the median and never past the cap, and every sample intact through packing.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "kernels/error.h"
#include "src/roles/long_sequence_batch.h"
#include "src/roles/sample_packing.h"

namespace rlf {
namespace {

LongSequenceShape small_shape() {
  LongSequenceShape shape;
  shape.prompt = {64, 0.5, 200};
  shape.response = {128, 1.0, 600};
  shape.vocab_size = 32;
  return shape;
}

double median_of(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

TEST(LongSequenceBatch, SameSeedSameBatchOtherSeedOtherBatch) {
  const auto a = long_sequence_batch(small_shape(), 64, 7);
  EXPECT_EQ(a, long_sequence_batch(small_shape(), 64, 7));
  EXPECT_NE(a, long_sequence_batch(small_shape(), 64, 8));
  // Sample i does not depend on how many samples are drawn.
  const auto prefix = long_sequence_batch(small_shape(), 16, 7);
  EXPECT_TRUE(std::equal(prefix.begin(), prefix.end(), a.begin()));
}

TEST(LongSequenceBatch, LengthsFollowTheMedianAndStayWithinTheCap) {
  const auto shape = small_shape();
  const auto batch = long_sequence_batch(shape, 2000, 3);
  std::vector<double> prompts, responses;
  int capped = 0;
  for (const QueueSample& s : batch) {
    ASSERT_GE(s.prompt.size(), 1u);
    ASSERT_LE(s.prompt.size(), size_t(shape.prompt.max));
    ASSERT_LE(s.response.size(), size_t(shape.response.max));
    ASSERT_EQ(s.behaviour_logp.size(), s.response.size());
    for (int32_t token : s.prompt) ASSERT_TRUE(token >= 0 && token < shape.vocab_size);
    for (float logp : s.behaviour_logp) ASSERT_TRUE(logp <= 0 && logp > -4);
    prompts.push_back(double(s.prompt.size()));
    responses.push_back(double(s.response.size()));
    capped += s.response.size() == size_t(shape.response.max);
  }
  // Medians within 10% of the configured ones (2000 draws: the sample median's spread is ~3%).
  EXPECT_NEAR(median_of(prompts), 64, 6.4);
  EXPECT_NEAR(median_of(responses), 128, 12.8);
  // P(lognormal(128, 1) > 600) = P(z > 1.545) = 6.1%: about 122 of 2000 responses hit the cap.
  EXPECT_GT(capped, 80);
  EXPECT_LT(capped, 170);
}

TEST(LongSequenceBatch, PackedBytesAreTheFormulaAndUnpackRestoresTheBatch) {
  const auto batch = long_sequence_batch(small_shape(), 32, 5);
  const auto buffer = pack_samples(batch, PackLayout::Packed);
  EXPECT_EQ(buffer.size(), packed_bytes(batch));
  EXPECT_EQ(unpack_samples(buffer), batch);
}

TEST(LongSequenceBatch, BadShapesAreConfigErrors) {
  for (auto change : std::vector<void (*)(LongSequenceShape&)>{
           [](LongSequenceShape& s) { s.prompt.median = 0; },
           [](LongSequenceShape& s) { s.response.sigma = -1; },
           [](LongSequenceShape& s) { s.response.sigma = 5; },
           [](LongSequenceShape& s) { s.response.max = 0; },
       }) {
    LongSequenceShape shape = small_shape();
    change(shape);
    EXPECT_THROW(long_sequence_batch(shape, 4, 1), ConfigError);
  }
}

}  // namespace
}  // namespace rlf
