// Zero-padding packing of queue samples: exact round trips in both layouts, sizes equal to the
// documented formulas, and every truncated or corrupted buffer rejected.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "src/roles/sample_packing.h"
#include "tests/queue_samples.h"
#include "tests/test_util.h"

namespace rlf {
namespace {

// The header's formulas, written out again here so that a change to the format must change both.
uint64_t packed_formula(const std::vector<QueueSample>& batch) {
  uint64_t tokens = 0, responses = 0;
  for (const auto& s : batch) {
    tokens += s.prompt.size() + s.response.size();
    responses += s.response.size();
  }
  return 32 + 48 * batch.size() + 4 * tokens + 4 * responses;
}

uint64_t padded_formula(const std::vector<QueueSample>& batch) {
  uint64_t max_p = 0, max_r = 0;
  for (const auto& s : batch) {
    max_p = std::max<uint64_t>(max_p, s.prompt.size());
    max_r = std::max<uint64_t>(max_r, s.response.size());
  }
  const uint64_t n = batch.size();
  return 32 + 48 * n + 4 * n * (max_p + max_r) + 4 * n * max_r;
}

const int kBatchSizes[] = {0, 1, 2, 3, 7, 16, 33};

TEST(SamplePacking, RoundTripsRandomBatchesInBothLayouts) {
  int empty_responses = 0, empty_prompts = 0;
  for (int b = 0; b < int(std::size(kBatchSizes)); ++b) {
    for (int seed = 0; seed < 4; ++seed) {
      const auto batch = test::random_batch(test::seed_for("pack", seed), 1000 * b, kBatchSizes[b]);
      for (const auto& s : batch) {
        empty_responses += s.response.empty();
        empty_prompts += s.prompt.empty();
      }
      for (PackLayout layout : {PackLayout::Packed, PackLayout::Padded}) {
        const auto buffer = pack_samples(batch, layout);
        EXPECT_EQ(unpack_samples(buffer), batch)
            << "batch of " << kBatchSizes[b] << ", layout " << int(layout);
      }
    }
  }
  // The random batches did exercise the edge cases.
  EXPECT_GT(empty_responses, 0);
  EXPECT_GT(empty_prompts, 0);
}

TEST(SamplePacking, RoundTripsAllEmptyResponses) {
  test::SampleShape shape;
  shape.empty_response_fraction = 1.0;
  const auto batch = test::random_batch(7, 0, 9, shape);
  for (PackLayout layout : {PackLayout::Packed, PackLayout::Padded})
    EXPECT_EQ(unpack_samples(pack_samples(batch, layout)), batch);
}

TEST(SamplePacking, EmptyBatchIsTheHeaderOnly) {
  const std::vector<QueueSample> empty;
  EXPECT_EQ(packed_bytes(empty), 32u);
  EXPECT_EQ(padded_bytes(empty), 32u);
  for (PackLayout layout : {PackLayout::Packed, PackLayout::Padded}) {
    const auto buffer = pack_samples(empty, layout);
    EXPECT_EQ(buffer.size(), 32u);
    EXPECT_TRUE(unpack_samples(buffer).empty());
  }
}

TEST(SamplePacking, SizesEqualTheFormulasExactly) {
  for (int b = 0; b < int(std::size(kBatchSizes)); ++b) {
    const auto batch = test::random_batch(test::seed_for("size", b), 0, kBatchSizes[b]);
    const uint64_t packed = packed_formula(batch), padded = padded_formula(batch);
    EXPECT_EQ(packed_bytes(batch), packed);
    EXPECT_EQ(padded_bytes(batch), padded);
    EXPECT_EQ(pack_samples(batch, PackLayout::Packed).size(), packed);
    EXPECT_EQ(pack_samples(batch, PackLayout::Padded).size(), padded);
    EXPECT_GE(padded, packed);
  }
}

TEST(SamplePacking, PaddedEqualsPackedOnlyWhenLengthsAreEqual) {
  auto batch = test::random_batch(3, 0, 5);
  for (auto& s : batch) {
    s.prompt.assign(6, 1);
    s.response.assign(10, 2);
    s.behaviour_logp.assign(10, -1.0f);
  }
  EXPECT_EQ(padded_bytes(batch), packed_bytes(batch));
  // One long-tail response makes every other sample pay for its length when padded.
  batch[0].response.assign(1000, 3);
  batch[0].behaviour_logp.assign(1000, -0.5f);
  EXPECT_GT(padded_bytes(batch), 4 * packed_bytes(batch));
  EXPECT_EQ(unpack_samples(pack_samples(batch, PackLayout::Padded)), batch);
}

TEST(SamplePacking, RejectsEveryTruncationAndExtension) {
  const auto batch = test::random_batch(11, 0, 4);
  for (PackLayout layout : {PackLayout::Packed, PackLayout::Padded}) {
    const auto buffer = pack_samples(batch, layout);
    for (size_t n = 0; n < buffer.size(); ++n)
      EXPECT_THROW(unpack_samples(std::span(buffer.data(), n)), PackingError) << "length " << n;
    auto longer = buffer;
    longer.push_back(std::byte{0});
    EXPECT_THROW(unpack_samples(longer), PackingError);
    longer.insert(longer.end(), 3, std::byte{0});  // a whole extra word
    EXPECT_THROW(unpack_samples(longer), PackingError);
  }
}

TEST(SamplePacking, RejectsEverySingleByteCorruption) {
  const auto batch = test::random_batch(13, 0, 3);
  for (PackLayout layout : {PackLayout::Packed, PackLayout::Padded}) {
    const auto buffer = pack_samples(batch, layout);
    for (size_t i = 0; i < buffer.size(); ++i) {
      for (unsigned flip : {0x01u, 0x80u, 0xFFu}) {
        auto bad = buffer;
        bad[i] ^= std::byte(flip);
        EXPECT_THROW(unpack_samples(bad), PackingError) << "byte " << i << " ^ " << flip;
      }
    }
  }
}

TEST(SamplePacking, FailedUnpackLeavesTheOutputUnchanged) {
  const auto batch = test::random_batch(17, 0, 3);
  auto buffer = pack_samples(batch);
  buffer.back() ^= std::byte{1};
  std::vector<QueueSample> out = test::random_batch(19, 100, 2);
  const auto before = out;
  EXPECT_THROW(unpack_samples_into(buffer, out), PackingError);
  EXPECT_EQ(out, before);
  // And a good buffer appends.
  unpack_samples_into(pack_samples(batch), out);
  ASSERT_EQ(out.size(), 5u);
  EXPECT_TRUE(std::equal(batch.begin(), batch.end(), out.begin() + 2));
}

TEST(SamplePacking, RefusesInconsistentSamples) {
  auto batch = test::random_batch(23, 0, 2);
  batch[1].response.push_back(5);  // one log-prob short
  EXPECT_THROW(pack_samples(batch), PackingError);
  batch[1].behaviour_logp.push_back(-1.0f);
  EXPECT_NO_THROW(pack_samples(batch));
  batch[0].version_min = batch[0].version_max + 1;
  EXPECT_THROW(pack_samples(batch), PackingError);
}

}  // namespace
}  // namespace rlf
