// Shared test helpers: seeded random inputs, llm.c-style comparison of a fast result against its
// reference, and central finite differences for gradient checks.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/arena.h"

namespace rlf::test {

// Fresh random inputs: the seed comes from the test name and a case index, so every shape gets
// different data and a failure is reproducible.
inline uint64_t seed_for(const std::string& name, int index) {
  return std::hash<std::string>{}(name) ^ (uint64_t(index) * 0x9E3779B97F4A7C15ull);
}

template <typename T>
std::vector<T> random_vector(size_t n, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = T(dist(gen));
  return v;
}

inline std::vector<int> random_ints(size_t n, uint64_t seed, int lo, int hi_inclusive) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int> dist(lo, hi_inclusive);
  std::vector<int> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

template <typename To, typename From>
std::vector<To> cast_vector(const std::vector<From>& v) {
  return std::vector<To>(v.begin(), v.end());
}

// Normalized mean squared error, ggml's nmse = mse(a, b) / mse(b, 0).
template <typename A, typename B>
double nmse(const A* got, const B* want, size_t n) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = double(got[i]) - double(want[i]);
    err += d * d;
    ref += double(want[i]) * double(want[i]);
  }
  return ref > 0 ? err / ref : err;
}

// Element-wise |got - want| <= atol + rtol * |want| (llm.c's validate_result); on failure prints
// the first mismatches and the normalized error, then fails the test.
template <typename A, typename B>
void expect_close(const A* got, const B* want, size_t n, const std::string& what,
                  double atol = 1e-5, double rtol = 1e-4) {
  size_t bad = 0;
  std::string first;
  for (size_t i = 0; i < n; ++i) {
    const double g = double(got[i]), w = double(want[i]);
    if (!(std::fabs(g - w) <= atol + rtol * std::fabs(w))) {
      if (bad < 5) {
        char buf[128];
        std::snprintf(buf, sizeof buf, "  [%zu] got %.9g want %.9g\n", i, g, w);
        first += buf;
      }
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << n << " values differ, nmse "
                     << nmse(got, want, n) << "\n"
                     << first;
}

template <typename A, typename B>
void expect_close(const std::vector<A>& got, const std::vector<B>& want, const std::string& what,
                  double atol = 1e-5, double rtol = 1e-4) {
  ASSERT_EQ(got.size(), want.size()) << what;
  expect_close(got.data(), want.data(), got.size(), what, atol, rtol);
}

// Central differences of loss() with respect to every element of x (in double), compared to the
// analytic gradient. loss() must read x.
inline void expect_gradient_matches(std::vector<double>& x, const std::vector<double>& analytic,
                                    const std::function<double()>& loss, const std::string& what,
                                    double step = 1e-6, double atol = 1e-7, double rtol = 1e-5) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  std::vector<double> numeric(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + step;
    const double up = loss();
    x[i] = saved - step;
    const double down = loss();
    x[i] = saved;
    numeric[i] = (up - down) / (2 * step);
  }
  expect_close(analytic, numeric, what + " (analytic vs finite difference)", atol, rtol);
}

// A scratch arena large enough for any test's work buffers.
inline Arena& scratch_arena() {
  static Arena arena("test-scratch", size_t(1) << 30);
  return arena;
}

}  // namespace rlf::test
