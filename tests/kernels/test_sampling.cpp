#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "kernels/parallel.h"
#include "kernels/sampling.h"
#include "tests/test_util.h"

namespace rlf {
namespace {

struct Batch {
  int B, V;
  std::vector<float> logits;
  std::vector<int64_t> sample_ids;
  std::vector<int> positions;
};

Batch random_batch(int B, int V, uint64_t seed, double scale = 3.0) {
  Batch b{B, V, test::random_vector<float>(size_t(B) * V, seed, -scale, scale), {}, {}};
  const auto ids = test::random_ints(size_t(B), seed + 1, 0, 1 << 30);
  b.sample_ids.assign(ids.begin(), ids.end());
  b.positions = test::random_ints(size_t(B), seed + 2, 0, 4096);
  return b;
}

// Same logits in every row; sample ids 0..B-1 at one position: B independent draws.
Batch repeated_row(const std::vector<float>& row, int B, int position = 17) {
  const int V = int(row.size());
  Batch b{B, V, std::vector<float>(size_t(B) * V), std::vector<int64_t>(B),
          std::vector<int>(B, position)};
  for (int i = 0; i < B; ++i) {
    std::copy(row.begin(), row.end(), b.logits.begin() + int64_t(i) * V);
    b.sample_ids[i] = i;
  }
  return b;
}

struct Draws {
  std::vector<int> tokens;
  std::vector<float> logp;
};

Draws sample_cpu(const Batch& b, uint64_t seed, float temperature, float top_p) {
  Draws d{std::vector<int>(b.B, -1), std::vector<float>(b.B, -99.f)};
  cpu::sample_tokens(d.tokens.data(), d.logp.data(), b.logits.data(), b.sample_ids.data(),
                     b.positions.data(), b.B, b.V, seed, temperature, top_p, test::scratch_arena());
  return d;
}

Draws sample_ref(const Batch& b, uint64_t seed, float temperature, float top_p) {
  Draws d{std::vector<int>(b.B, -1), std::vector<float>(b.B, -99.f)};
  ref::sample_tokens(d.tokens.data(), d.logp.data(), b.logits.data(), b.sample_ids.data(),
                     b.positions.data(), b.B, b.V, seed, temperature, top_p);
  return d;
}

// softmax(row / temperature) in double.
std::vector<double> softmax(const float* row, int V, double temperature) {
  double max = -INFINITY;
  for (int v = 0; v < V; ++v) max = std::max(max, double(row[v]) / temperature);
  std::vector<double> p(V);
  double sum = 0;
  for (int v = 0; v < V; ++v) sum += p[v] = std::exp(double(row[v]) / temperature - max);
  for (auto& x : p) x /= sum;
  return p;
}

int argmax(const float* row, int V) {
  return int(std::max_element(row, row + V) - row);
}

// Pearson chi-square of counts against probabilities p (cells with p > 0).
double chi_square(const std::vector<int>& tokens, const std::vector<double>& p) {
  std::vector<double> counts(p.size(), 0.0);
  for (int t : tokens) counts[size_t(t)] += 1;
  double chi = 0;
  for (size_t v = 0; v < p.size(); ++v) {
    if (p[v] <= 0) continue;
    const double expected = p[v] * double(tokens.size());
    chi += (counts[v] - expected) * (counts[v] - expected) / expected;
  }
  return chi;
}

const std::vector<float> kRow = {2.0f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f, -2.0f, 1.5f};

}  // namespace

TEST(Sampling, CpuMatchesRefExactly) {
  const struct {
    int B, V;
    float temperature, top_p;
  } cases[] = {{1, 1, 1.0f, 1.0f},   {1, 64, 1.0f, 1.0f},    {7, 13, 0.7f, 0.9f},
               {33, 64, 1.3f, 0.5f}, {5, 1000, 1.0f, 0.95f}, {3, 32000, 0.8f, 1.0f},
               {9, 31, 0.0f, 1.0f},  {130, 17, 1.0f, 0.3f}};
  for (size_t i = 0; i < std::size(cases); ++i) {
    const auto& c = cases[i];
    const auto batch = random_batch(c.B, c.V, test::seed_for("Sampling.CpuMatchesRef", int(i)));
    const auto a = sample_cpu(batch, 1234, c.temperature, c.top_p);
    const auto r = sample_ref(batch, 1234, c.temperature, c.top_p);
    EXPECT_EQ(a.tokens, r.tokens) << "case " << i;
    EXPECT_EQ(0, std::memcmp(a.logp.data(), r.logp.data(), a.logp.size() * sizeof(float)))
        << "case " << i;
    for (int b = 0; b < c.B; ++b) {
      ASSERT_GE(a.tokens[b], 0);
      ASSERT_LT(a.tokens[b], c.V);
    }
  }
}

// The fast kernel orders only the tokens that can reach the nucleus (kernels/cpu/sampling.cpp):
// rows where that prefix is a few tokens (peaked), all of them (flat), where many probabilities tie
// (logits on a coarse grid), and nuclei within rounding of the whole row, where its first prefix
// can fall short and it orders the rest.
TEST(Sampling, CpuMatchesRefExactlyOnPeakedFlatAndTiedRows) {
  const struct {
    int B, V;
    double scale;
    bool tied;
    float temperature, top_p;
  } cases[] = {{64, 64, 30.0, false, 1.0f, 0.9f},      {64, 4096, 20.0, false, 1.0f, 0.95f},
               {64, 64, 1e-3, false, 1.0f, 0.9f},      {64, 1000, 1e-6, false, 0.7f, 0.5f},
               {64, 64, 2.0, true, 1.0f, 0.9f},        {64, 257, 4.0, true, 1.3f, 0.6f},
               {64, 64, 3.0, false, 1.0f, 0.9999999f}, {64, 4096, 1e-4, false, 1.0f, 0.99999994f},
               {64, 50, 3.0, false, 1.0f, 1e-6f},      {64, 64, 0.0, false, 1.0f, 0.9f}};
  for (size_t i = 0; i < std::size(cases); ++i) {
    const auto& c = cases[i];
    auto batch =
        random_batch(c.B, c.V, test::seed_for("Sampling.CpuMatchesRefExactlyOnPeaked", int(i)),
                     c.scale > 0 ? c.scale : 1.0);
    for (float& x : batch.logits) {
      if (c.scale == 0.0) x = 0.5f;  // every token ties
      if (c.tied) x = std::round(x);
    }
    const auto a = sample_cpu(batch, 77, c.temperature, c.top_p);
    const auto r = sample_ref(batch, 77, c.temperature, c.top_p);
    EXPECT_EQ(a.tokens, r.tokens) << "case " << i;
    EXPECT_EQ(0, std::memcmp(a.logp.data(), r.logp.data(), a.logp.size() * sizeof(float)))
        << "case " << i;
  }
}

// Logits that are NaN (a diverged model) still give each row a token of its vocabulary: the fast
// kernel's nucleus is never empty.
TEST(Sampling, CpuGivesATokenOfTheVocabularyForNanLogits) {
  auto batch = random_batch(16, 64, test::seed_for("Sampling.CpuGivesATokenForNanLogits", 0));
  for (int b = 0; b < batch.B; ++b) {
    for (int v = 0; v < batch.V; ++v) {
      // Every logit of the even rows, every third of the odd ones.
      if (b % 2 == 0 || v % 3 == 0) batch.logits[size_t(b) * batch.V + v] = std::nanf("");
    }
  }
  for (const float top_p : {0.9f, 1.0f}) {
    const auto d = sample_cpu(batch, 5, 1.0f, top_p);
    for (int b = 0; b < batch.B; ++b) {
      EXPECT_GE(d.tokens[b], 0) << "row " << b;
      EXPECT_LT(d.tokens[b], batch.V) << "row " << b;
    }
  }
}

TEST(Sampling, GreedyWhenTemperatureIsZeroOrNegative) {
  const auto batch = random_batch(20, 37, test::seed_for("Sampling.Greedy", 0));
  for (float temperature : {0.0f, -1.0f}) {
    for (const auto& d :
         {sample_cpu(batch, 5, temperature, 0.9f), sample_ref(batch, 5, temperature, 0.9f)}) {
      for (int b = 0; b < batch.B; ++b) {
        EXPECT_EQ(d.tokens[b], argmax(batch.logits.data() + int64_t(b) * batch.V, batch.V));
        EXPECT_EQ(d.logp[b], 0.0f);
      }
    }
  }
  // Ties go to the lowest token id.
  Batch tie = repeated_row({0.f, 3.f, 1.f, 3.f, 3.f}, 4);
  EXPECT_EQ(sample_cpu(tie, 5, 0.0f, 1.0f).tokens, std::vector<int>(4, 1));
  EXPECT_EQ(sample_ref(tie, 5, 0.0f, 1.0f).tokens, std::vector<int>(4, 1));
}

TEST(Sampling, TinyTopPIsArgmax) {
  const auto batch = random_batch(50, 29, test::seed_for("Sampling.TinyTopP", 0));
  for (float top_p : {1e-6f, 0.0f}) {
    const auto d = sample_cpu(batch, 99, 1.5f, top_p);
    for (int b = 0; b < batch.B; ++b) {
      const float* row = batch.logits.data() + int64_t(b) * batch.V;
      EXPECT_EQ(d.tokens[b], argmax(row, batch.V)) << b;
      // logp is still the full (untruncated) log-softmax.
      const auto p = softmax(row, batch.V, 1.5);
      EXPECT_NEAR(d.logp[b], std::log(p[size_t(d.tokens[b])]), 1e-5) << b;
    }
  }
}

TEST(Sampling, DependsOnlyOnSeedSampleIdPositionAndLogits) {
  const int B = 40, V = 23;
  const auto batch = random_batch(B, V, test::seed_for("Sampling.BatchOrder", 0), 1.0);
  const auto base = sample_cpu(batch, 77, 1.0f, 0.9f);
  // Reverse-and-rotate permutation of the rows.
  std::vector<int> perm(B);
  for (int i = 0; i < B; ++i) perm[i] = (B - 1 - i + 7) % B;
  Batch shuffled = batch;
  for (int i = 0; i < B; ++i) {
    std::copy_n(batch.logits.begin() + int64_t(perm[i]) * V, V,
                shuffled.logits.begin() + int64_t(i) * V);
    shuffled.sample_ids[i] = batch.sample_ids[perm[i]];
    shuffled.positions[i] = batch.positions[perm[i]];
  }
  const auto moved = sample_cpu(shuffled, 77, 1.0f, 0.9f);
  const auto moved_ref = sample_ref(shuffled, 77, 1.0f, 0.9f);
  for (int i = 0; i < B; ++i) {
    EXPECT_EQ(moved.tokens[i], base.tokens[perm[i]]) << i;
    EXPECT_EQ(moved.logp[i], base.logp[perm[i]]) << i;
    EXPECT_EQ(moved_ref.tokens[i], base.tokens[perm[i]]) << i;
  }
  // A single row sampled alone also agrees.
  Batch one{1,
            V,
            std::vector<float>(batch.logits.begin() + 5 * V, batch.logits.begin() + 6 * V),
            {batch.sample_ids[5]},
            {batch.positions[5]}};
  EXPECT_EQ(sample_cpu(one, 77, 1.0f, 0.9f).tokens[0], base.tokens[5]);
  // The stream does depend on the seed, the sample id and the position: over flat logits the
  // draws are not all the same when any one of them changes.
  Batch flat = repeated_row(std::vector<float>(64, 0.f), 64);
  const auto flat_a = sample_cpu(flat, 1, 1.0f, 1.0f);
  const auto flat_b = sample_cpu(flat, 2, 1.0f, 1.0f);
  EXPECT_NE(flat_a.tokens, flat_b.tokens);
  std::set<int> distinct(flat_a.tokens.begin(), flat_a.tokens.end());
  EXPECT_GT(distinct.size(), 20u);  // sample ids 0..63 give different draws
  Batch flat_pos = flat;
  std::fill(flat_pos.positions.begin(), flat_pos.positions.end(), 18);
  EXPECT_NE(sample_cpu(flat_pos, 1, 1.0f, 1.0f).tokens, flat_a.tokens);
}

TEST(Sampling, FrequenciesMatchSoftmax) {
  const int draws = 20000;
  const auto batch = repeated_row(kRow, draws);
  const auto d = sample_cpu(batch, 2024, 1.0f, 1.0f);
  const auto p = softmax(kRow.data(), int(kRow.size()), 1.0);
  // 7 degrees of freedom: P(chi2 > 40) ~ 1e-6.
  EXPECT_LT(chi_square(d.tokens, p), 40.0);
  // Against a wrong distribution (temperature 2) the same statistic is huge: the test can fail.
  EXPECT_GT(chi_square(d.tokens, softmax(kRow.data(), int(kRow.size()), 2.0)), 200.0);
  for (int b = 0; b < draws; b += 97) {
    EXPECT_NEAR(d.logp[b], std::log(p[size_t(d.tokens[b])]), 1e-5);
  }
}

TEST(Sampling, TopPKeepsOnlyTheNucleus) {
  const int draws = 20000;
  const auto batch = repeated_row(kRow, draws);
  const int V = int(kRow.size());
  for (float temperature : {1.0f, 0.6f}) {
    const auto p = softmax(kRow.data(), V, temperature);
    std::vector<int> order(V);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
    for (float top_p : {0.5f, 0.8f, 0.93f}) {
      // Nucleus computed here in double; the chosen top_p values are far from its boundaries.
      std::vector<double> nucleus(V, 0.0);
      double cumulative = 0;
      for (int k = 0; k < V && cumulative < top_p; ++k) {
        cumulative += p[order[k]];
        nucleus[order[k]] = p[order[k]];
      }
      const std::string what =
          "T=" + std::to_string(temperature) + " top_p=" + std::to_string(top_p);
      for (auto& x : nucleus) x /= cumulative;
      const auto d = sample_cpu(batch, 31, temperature, top_p);
      int kept = 0;
      for (double x : nucleus) kept += x > 0;
      ASSERT_LT(kept, V) << what;
      for (int b = 0; b < draws; ++b) {
        ASSERT_GT(nucleus[size_t(d.tokens[b])], 0.0) << what << " token " << d.tokens[b];
      }
      EXPECT_LT(chi_square(d.tokens, nucleus), 40.0) << what;
      // logp is the untruncated log-softmax, not the renormalized nucleus.
      EXPECT_NEAR(d.logp[0], std::log(p[size_t(d.tokens[0])]), 1e-5) << what;
    }
  }
}

TEST(Sampling, TemperatureFlattensTheDistribution) {
  const int draws = 20000;
  const auto batch = repeated_row(kRow, draws);
  const int top = argmax(kRow.data(), int(kRow.size()));
  std::vector<double> top_frequency;
  for (float temperature : {0.3f, 1.0f, 3.0f}) {
    const auto d = sample_cpu(batch, 8, temperature, 1.0f);
    const auto p = softmax(kRow.data(), int(kRow.size()), temperature);
    EXPECT_LT(chi_square(d.tokens, p), 40.0) << "T=" << temperature;
    top_frequency.push_back(double(std::count(d.tokens.begin(), d.tokens.end(), top)) / draws);
    for (int b = 0; b < draws; b += 101) {
      EXPECT_NEAR(d.logp[b], std::log(p[size_t(d.tokens[b])]), 1e-5) << "T=" << temperature;
    }
  }
  EXPECT_GT(top_frequency[0], top_frequency[1] + 0.1);
  EXPECT_GT(top_frequency[1], top_frequency[2] + 0.1);
}

TEST(Sampling, CpuIsDeterministicAcrossThreadCounts) {
  const int B = 300, V = 257;  // 5 rows per chunk: 60 chunks
  const auto batch = random_batch(B, V, test::seed_for("Sampling.Determinism", 0));
  const auto run = [&](int threads) {
    ThreadLimit limit(threads);
    return sample_cpu(batch, 4242, 0.9f, 0.95f);
  };
  const auto a = run(1), b = run(2);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(0, std::memcmp(a.logp.data(), b.logp.data(), a.logp.size() * sizeof(float)));
}

}  // namespace rlf
