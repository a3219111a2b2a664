// Token sampling (kernels/sampling.h's algorithm) with a block per row:
//   greedy: block argmax, ties to the lowest id;
//   else:   p = softmax(logits / temperature) (sum in double), a bitonic sort of (p, id) by p
//           descending and id ascending, then a chunked scan of the sorted probabilities for the
//           nucleus (top_p) and the inverse CDF at u = Philox(seed, sample id, position) *
//           kept mass, the same u as the CPU draws.
#include <climits>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/reduce.h"
#include "kernels/cuda/runtime.h"

namespace rlf::RLF_CUDA_NS {
namespace {

constexpr int kThreads = 256;

// Philox-4x32-10 as in kernels/rng.h.
__device__ __forceinline__ float philox_uniform_device(uint64_t seed, uint64_t stream,
                                                       uint64_t position) {
  uint32_t c0 = uint32_t(position), c1 = uint32_t(position >> 32);
  uint32_t c2 = uint32_t(stream), c3 = uint32_t(stream >> 32);
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(0xD2511F53u) * c0;
    const uint64_t p1 = uint64_t(0xCD9E8D57u) * c2;
    const uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n1 = uint32_t(p1);
    const uint32_t n2 = uint32_t(p0 >> 32) ^ c3 ^ k1;
    const uint32_t n3 = uint32_t(p0);
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return float(c0 >> 8) * (1.0f / 16777216.0f);
}

__global__ void philox_kernel(float* out, uint64_t seed, const int64_t* streams,
                              const int* positions, int n) {
  const int i = int(blockIdx.x) * int(blockDim.x) + int(threadIdx.x);
  if (i < n) {
    out[i] = philox_uniform_device(seed, uint64_t(streams[i]), uint64_t(int64_t(positions[i])));
  }
}

__device__ __forceinline__ bool ranks_before(float ka, int ia, float kb, int ib) {
  return ka > kb || (ka == kb && ia < ib);
}

// The first rank r in [0, limit) at which the running sum of keys[0..r] passes the threshold
// (>= when inclusive, else >), and the running sum there; -1 if none. Thread t scans the chunk
// [t * chunk, (t + 1) * chunk) starting from the exclusive prefix of the chunk sums.
__device__ void first_crossing(const float* keys, int limit, int chunk, const double* prefix,
                               double threshold, bool inclusive, int* rank_out, double* sum_out) {
  __shared__ int ranks[kThreads];
  __shared__ double sums[kThreads];
  const int t = int(threadIdx.x);
  int found = -1;
  double running = prefix[t], at = 0.0;
  for (int r = t * chunk; r < (t + 1) * chunk && r < limit; ++r) {
    running += double(keys[r]);
    if (inclusive ? running >= threshold : running > threshold) {
      found = r;
      at = running;
      break;
    }
  }
  ranks[t] = found;
  sums[t] = at;
  __syncthreads();
  if (t == 0) {
    int rank = -1;
    double sum = 0.0;
    for (int i = 0; i < int(blockDim.x); ++i) {
      if (ranks[i] >= 0) {
        rank = ranks[i];
        sum = sums[i];
        break;
      }
    }
    *rank_out = rank;
    *sum_out = sum;
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads)
    sample_kernel(int* tokens, float* logp, const float* logits, const int64_t* sample_ids,
                  const int* positions, int V, int P, uint64_t seed, float temperature, float top_p,
                  float* key_scratch, int* id_scratch) {
  __shared__ int best_id[kThreads];
  __shared__ double prefix[kThreads + 1];
  __shared__ int kept_rank, token_rank;
  __shared__ double kept_sum, token_sum;
  const int b = int(blockIdx.x), t = int(threadIdx.x);
  const float* x = logits + int64_t(b) * V;
  if (!(temperature > 0.0f)) {
    // Greedy: the first (lowest id) maximum.
    int best = -1;
    for (int v = t; v < V; v += int(blockDim.x)) {
      if (best < 0 || x[v] > x[best]) best = v;
    }
    best_id[t] = best;
    __syncthreads();
    if (t == 0) {
      int winner = 0;
      float top = x[0];
      for (int i = 0; i < int(blockDim.x); ++i) {
        const int id = best_id[i];
        if (id >= 0 && (x[id] > top || (x[id] == top && id < winner))) {
          winner = id;
          top = x[id];
        }
      }
      tokens[b] = winner;
      if (logp) logp[b] = 0.0f;
    }
    return;
  }
  float local_max = -INFINITY;
  for (int v = t; v < V; v += int(blockDim.x)) {
    const float s = x[v] / temperature;
    local_max = s > local_max ? s : local_max;
  }
  const float mx = block_max(local_max, -INFINITY);
  float* keys = key_scratch + int64_t(b) * P;
  int* ids = id_scratch + int64_t(b) * P;
  double local_sum = 0.0;
  for (int v = t; v < V; v += int(blockDim.x)) {
    const float e = expf(x[v] / temperature - mx);
    keys[v] = e;
    local_sum += double(e);
  }
  const double sum = block_sum(local_sum);  // its barriers publish keys[]
  const double inv_sum = 1.0 / sum;
  for (int v = t; v < P; v += int(blockDim.x)) {
    if (v < V) {
      keys[v] = float(double(keys[v]) * inv_sum);
      ids[v] = v;
    } else {
      keys[v] = -1.0f;  // padding sorts last
      ids[v] = INT_MAX;
    }
  }
  __syncthreads();
  // Bitonic sort of P = 2^k entries into rank order.
  for (int k = 2; k <= P; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = t; i < P; i += int(blockDim.x)) {
        const int l = i ^ j;
        if (l <= i) continue;
        const bool forward = (i & k) == 0;
        const bool in_order = ranks_before(keys[i], ids[i], keys[l], ids[l]);
        if (forward != in_order) {
          const float kk = keys[i];
          keys[i] = keys[l];
          keys[l] = kk;
          const int ii = ids[i];
          ids[i] = ids[l];
          ids[l] = ii;
        }
      }
      __syncthreads();
    }
  }
  // Chunk sums and their exclusive prefix.
  const int chunk = (V + int(blockDim.x) - 1) / int(blockDim.x);
  double chunk_sum = 0.0;
  for (int r = t * chunk; r < (t + 1) * chunk && r < V; ++r) chunk_sum += double(keys[r]);
  prefix[t + 1] = chunk_sum;
  __syncthreads();
  if (t == 0) {
    prefix[0] = 0.0;
    for (int i = 1; i <= int(blockDim.x); ++i) prefix[i] += prefix[i - 1];
  }
  __syncthreads();
  int kept = V;
  double kept_mass = prefix[blockDim.x];
  if (top_p < 1.0f) {
    first_crossing(keys, V, chunk, prefix, double(top_p), true, &kept_rank, &kept_sum);
    if (kept_rank >= 0) {
      kept = kept_rank + 1;
      kept_mass = kept_sum;
    }
  }
  const double u = double(philox_uniform_device(seed, uint64_t(sample_ids[b]),
                                                uint64_t(int64_t(positions[b])))) *
                   kept_mass;
  first_crossing(keys, kept, chunk, prefix, u, false, &token_rank, &token_sum);
  if (t == 0) {
    const int token = ids[token_rank >= 0 ? token_rank : kept - 1];
    tokens[b] = token;
    if (logp) logp[b] = float(double(x[token] / temperature - mx) - log(sum));
  }
}

}  // namespace

void sample_tokens(int* tokens, float* logp, const float* logits, const int64_t* sample_ids,
                   const int* positions, int B, int V, uint64_t seed, float temperature,
                   float top_p, Arena& arena) {
  if (B <= 0 || V <= 0) return;
  Workspace ws(arena);
  const float* d_logits = ws.in(logits, size_t(B) * V);
  const int64_t* d_ids = ws.in(sample_ids, size_t(B));
  const int* d_positions = ws.in(positions, size_t(B));
  int* d_tokens = ws.out(tokens, size_t(B));
  float* d_logp = ws.out(logp, size_t(B));
  int P = 1;
  while (P < V) P <<= 1;
  const bool greedy = !(temperature > 0.0f);
  float* keys = greedy ? nullptr : ws.scratch<float>(size_t(B) * P);
  int* ids = greedy ? nullptr : ws.scratch<int>(size_t(B) * P);
  RLF_LAUNCH(sample_kernel, unsigned(B), kThreads, 0, d_tokens, d_logp, d_logits, d_ids,
             d_positions, V, P, seed, temperature, top_p, keys, ids);
  ws.finish("sample_tokens");
}

void philox_uniform_batch(float* out, uint64_t seed, const int64_t* streams, const int* positions,
                          int n, Arena& arena) {
  if (n <= 0) return;
  Workspace ws(arena);
  const int64_t* d_streams = ws.in(streams, size_t(n));
  const int* d_positions = ws.in(positions, size_t(n));
  float* d_out = ws.out(out, size_t(n));
  RLF_LAUNCH(philox_kernel, blocks_for(n, kThreads), kThreads, 0, d_out, seed, d_streams,
             d_positions, n);
  ws.finish("philox_uniform_batch");
}

}  // namespace rlf::RLF_CUDA_NS
