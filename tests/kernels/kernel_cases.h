// Inputs shared by the CPU and the CUDA kernel suites: MoE routings and attention packings
// (sequence lengths, heads, a lead of unowned tokens) with their random tensors.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kernels/moe.h"
#include "tests/test_util.h"

namespace rlf::test {

// K distinct experts per token, drawn from the experts not listed in `empty`.
inline std::vector<int> random_assignment(int N, int E, int K, uint64_t seed,
                                          const std::set<int>& empty = {}) {
  std::mt19937_64 gen(seed);
  std::vector<int> pool;
  for (int e = 0; e < E; ++e)
    if (!empty.count(e)) pool.push_back(e);
  std::vector<int> idx(size_t(N) * K);
  for (int n = 0; n < N; ++n) {
    std::shuffle(pool.begin(), pool.end(), gen);
    for (int k = 0; k < K; ++k) idx[size_t(n) * K + k] = pool[k];
  }
  return idx;
}

struct Routing {
  std::vector<int> offsets, row_of_assignment, token_of_row;
  int M() const { return offsets.back(); }
};

inline Routing build_routing(const std::vector<int>& idx, int N, int E, int K) {
  Routing r{std::vector<int>(E + 1), std::vector<int>(size_t(N) * K),
            std::vector<int>(size_t(N) * K)};
  moe_build_routing(r.offsets.data(), r.row_of_assignment.data(), r.token_of_row.data(), idx.data(),
                    N, E, K);
  return r;
}

// Expert weights or gradients as the grouped expert kernels take them: one pointer per expert to
// its w1 [F, C], w3 [F, C] and w2 [C, F]. Consecutive: rows of three [E, F, C] / [E, C, F]
// tensors (a flat parameter buffer). Otherwise parameter buckets: each expert's w1 | w3 | w2 in a
// slot of its own, slots in a shuffled order with unused slots between them (a slot pool after
// out-of-order give-backs).
template <typename T>
struct ExpertPointers {
  ExpertPointers(const std::vector<T>& w1_rows, const std::vector<T>& w3_rows,
                 const std::vector<T>& w2_rows, int experts, int F, int C, bool consecutive,
                 uint64_t seed = 0)
      : E(experts), FC(int64_t(F) * C) {
    std::vector<size_t> first(3 * size_t(E));  // storage index of (expert, matrix)
    if (consecutive) {
      for (int e = 0; e < E; ++e)
        for (int m = 0; m < 3; ++m) first[size_t(e) * 3 + m] = (size_t(m) * E + e) * FC;
      storage.resize(3 * size_t(E) * FC);
    } else {
      // 2E slots: every other one unused, the experts in a random order over the rest.
      std::vector<size_t> slot(2 * size_t(E));
      std::iota(slot.begin(), slot.end(), size_t(0));
      std::shuffle(slot.begin(), slot.end(), std::mt19937_64(seed));
      for (int e = 0; e < E; ++e)
        for (int m = 0; m < 3; ++m) first[size_t(e) * 3 + m] = (slot[size_t(e)] * 3 + m) * FC;
      storage.assign(6 * size_t(E) * FC, T(-99));
    }
    const std::vector<T>* rows[3] = {&w1_rows, &w3_rows, &w2_rows};
    std::vector<T*>* pointers[3] = {&w1, &w3, &w2};
    for (int e = 0; e < E; ++e) {
      for (int m = 0; m < 3; ++m) {
        T* p = storage.data() + first[size_t(e) * 3 + m];
        std::copy_n(rows[m]->begin() + e * FC, FC, p);
        pointers[m]->push_back(p);
      }
    }
  }
  ExpertPointers(const ExpertPointers&) = delete;
  ExpertPointers& operator=(const ExpertPointers&) = delete;

  // Matrix m (0: w1, 1: w3, 2: w2) of every expert, back as a [E, ...] tensor.
  std::vector<T> rows(int m) const {
    const std::vector<T*>& p = m == 0 ? w1 : m == 1 ? w3 : w2;
    std::vector<T> out(size_t(E) * FC);
    for (int e = 0; e < E; ++e) std::copy_n(p[size_t(e)], FC, out.begin() + e * FC);
    return out;
  }

  int E;
  int64_t FC;
  std::vector<T> storage;
  std::vector<T*> w1, w3, w2;
};

// A packing: sequence lengths -> seq_offsets[S + 1].
inline std::vector<int> offsets_for(const std::vector<int>& lengths) {
  std::vector<int> offsets(lengths.size() + 1, 0);
  std::partial_sum(lengths.begin(), lengths.end(), offsets.begin() + 1);
  return offsets;
}

struct Packing {
  std::string name;
  std::vector<int> lengths;
  int H, D;
  int lead = 0;  // tokens before seq_offsets[0], owned by no sequence
};

// Single sequences (length 1, one block, several blocks with a ragged tail) and many sequences
// of random lengths including length 1, with odd head dimensions.
inline std::vector<Packing> attention_packings() {
  std::vector<int> random_lengths = random_ints(9, 12345, 1, 100);
  random_lengths.insert(random_lengths.begin() + 3, 1);
  random_lengths.push_back(1);
  return {
      {"single-token", {1}, 2, 8},
      {"single-short", {7}, 1, 5},
      {"single-one-block", {64}, 2, 16},
      {"single-ragged", {150}, 3, 13},
      {"many-random", random_lengths, 3, 17},
      {"many-ones", {1, 1, 1, 2, 1}, 4, 8},
      {"offset-start", {3, 70, 1}, 2, 9, 5},
  };
}

struct AttentionInputs {
  std::vector<int> offsets;
  int N, S, H, D;
  std::vector<float> q, k, v;
};

inline AttentionInputs make_attention_inputs(const Packing& pk, uint64_t seed) {
  AttentionInputs in;
  in.offsets = offsets_for(pk.lengths);
  for (int& o : in.offsets) o += pk.lead;
  in.S = int(pk.lengths.size());
  in.N = in.offsets.back();
  in.H = pk.H;
  in.D = pk.D;
  const size_t n = size_t(in.N) * in.H * in.D;
  // Wide enough range that softmax is far from uniform.
  in.q = random_vector<float>(n, seed + 1, -2, 2);
  in.k = random_vector<float>(n, seed + 2, -2, 2);
  in.v = random_vector<float>(n, seed + 3);
  return in;
}

struct DecodeInputs {
  int B, H, D, slots, max_len;
  std::vector<int> cache_slots, cache_lens;
  std::vector<float> q, k_cache, v_cache;
};

// B rows over `slots` cache slots of max_len positions; row 0 at length 1, row 1 full.
inline DecodeInputs make_decode(int B, int H, int D, int slots, int max_len, uint64_t seed) {
  DecodeInputs in{B, H, D, slots, max_len, {}, {}, {}, {}, {}};
  in.cache_slots = random_ints(size_t(B), seed, 0, slots - 1);
  in.cache_lens = random_ints(size_t(B), seed + 1, 1, max_len);
  in.cache_lens[0] = 1;
  if (B > 1) in.cache_lens[1] = max_len;
  const size_t cache = size_t(slots) * max_len * H * D;
  in.q = random_vector<float>(size_t(B) * H * D, seed + 2, -2, 2);
  in.k_cache = random_vector<float>(cache, seed + 3, -2, 2);
  in.v_cache = random_vector<float>(cache, seed + 4);
  return in;
}

}  // namespace rlf::test
