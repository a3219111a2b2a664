// `rlfusion bench calibrate`: measures this machine's rates and writes a cluster file for the
// planner (src/sim/cluster.h): the FLOP/s of the runtime's own layers (forward + backward of
// reference shapes) against the rows a call processes and the width of its matrices (Hockney's
// peak, half-rate rows and width), the cpu matmul checked against its reference, the cost of a
// kernel call beyond its work, the optimizer step's and the sampler's rates, memory bandwidth
// (copy), and, under mpiexec with 2 ranks, MPI ping-pong between them through the runtime's Links
// (latency from 8-byte messages, bandwidth from 4 MiB ones), once as an intra-node link and, with
// --inter-node-bandwidth or --inter-node-latency, once more through link emulation as the
// inter-node link. Each rank is a device; the host is the same memory (host bandwidth = the
// offload's copy). Nothing comes from published figures.
#include <mpi.h>

#include <Eigen/Dense>
#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "kernels/adamw.h"
#include "kernels/arena.h"
#include "kernels/device.h"
#include "kernels/error.h"
#include "kernels/gpu.h"
#include "kernels/linear.h"
#include "kernels/rng.h"
#include "kernels/sampling.h"
#include "mpi_comm/links.h"
#include "src/app/bench_timing.h"
#include "src/app/build_info.h"
#include "src/app/calibrate_expert_exchange.h"
#include "src/app/calibrate_rollout_handoffs.h"
#include "src/app/commands.h"
#include "src/app/options.h"
#include "src/model/transformer.h"
#include "src/sim/cluster.h"
#include "src/sim/cost_model.h"

namespace rlf {

namespace {

double seconds_of(const std::function<void()>& body, int repeats) {
  return time_interleaved({body}, repeats)[0];
}

struct Matmul {
  double rate = 0, nmse = 0;
};

Matmul measure_matmul(Arena& scratch, int repeats) {
  auto filled = [](int n, uint64_t stream) {
    std::vector<float> v(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) v[size_t(i)] = philox_uniform(7, stream, uint64_t(i)) - 0.5f;
    return v;
  };
  Matmul m;
  {  // correctness at 256^3 against the reference
    const int n = 256;
    const auto a = filled(n * n, 1), w = filled(n * n, 2);
    std::vector<float> fast(static_cast<size_t>(n * n)), ref_out(static_cast<size_t>(n * n));
    cpu::matmul_forward(fast.data(), a.data(), w.data(), n, n, n, scratch);
    ref::matmul_forward(ref_out.data(), a.data(), w.data(), n, n, n);
    double num = 0, den = 0;
    for (size_t i = 0; i < fast.size(); ++i) {
      num += double(fast[i] - ref_out[i]) * (fast[i] - ref_out[i]);
      den += double(ref_out[i]) * ref_out[i];
    }
    m.nmse = num / den;
  }
  // The large-matrix rate, printed for comparison with the layer rates.
  const int n = 1024;
  const auto a = filled(n * n, 3), w = filled(n * n, 4);
  std::vector<float> out(static_cast<size_t>(n) * size_t(n));
  m.rate =
      2.0 * n * n * n /
      seconds_of([&] { cpu::matmul_forward(out.data(), a.data(), w.data(), n, n, n, scratch); },
                 repeats);
  return m;
}

// What a kernel call costs beyond its work, inside the runtime's own layer: the training forward
// of one token through a one-layer model of the smallest shape (d_model 8, 2 experts), divided by
// the cost model's kernel calls for it (kKernelsPerLayer per layer + 3: embedding, final norm,
// head). Arena allocations, routing bookkeeping and dispatch are in it, as in every real call.
double measure_kernel_overhead(Device& device, int repeats) {
  ModelConfig config;
  config.name = "calibrate-micro";
  config.vocab_size = 8;
  config.d_model = 8;
  config.n_layers = 1;
  config.n_heads = 2;
  config.n_experts = 2;
  config.top_k = 1;
  config.d_ff = 8;
  config.max_seq_len = 8;
  Transformer<float> model(config, device.ops(), device.memory(), /*with_gradients=*/false);
  model.initialize(1);
  const int tokens[1] = {1}, offsets[2] = {0, 1};
  const int calls = 200;
  const double seconds = seconds_of(
                             [&] {
                               for (int i = 0; i < calls; ++i) {
                                 model.forward(tokens, offsets, 1);
                                 model.release_activations();
                               }
                             },
                             repeats) /
                         calls;
  return seconds / (config.n_layers * sim::kKernelsPerLayer + 3);
}

struct LayerRates {
  double peak = 0, half_rows = 0, half_width = 0;
  struct Point {
    int width, rows;
    double model_width, rate;  // ModelShape::width, FLOP/s
  };
  std::vector<Point> measured;
  // The touched experts' cost of each reference model (sim::ClusterConfig::active_expert_seconds):
  // expert bytes ascending, seconds an expert a layer's forward + backward.
  std::vector<double> expert_bytes, expert_seconds;
  // A row's work beyond its FLOPs, a layer: forward + backward (sim::ClusterConfig::row_seconds),
  // and a forward's share of it (forward_row_seconds). Layer rates only.
  double row_seconds = 0, forward_row_seconds = 0;
};

// A reference model of matrix width `width` (d_model; expert and shared widths `ffn_width`, 2 x
// the width when 0; 8 experts top-2, 4 heads, vocab 64): shapes of their own, not one of the
// validated models.
ModelConfig reference_model(int width, int ffn_width = 0) {
  ModelConfig config;
  config.name = "calibrate-reference";
  config.vocab_size = 64;
  config.d_model = width;
  config.n_layers = 2;
  config.n_heads = 4;
  config.n_experts = 8;
  config.top_k = 2;
  config.d_ff = ffn_width > 0 ? ffn_width : 2 * width;
  config.shared_expert_d_ff = config.d_ff;
  config.max_seq_len = 64;
  return config;
}

// The router skew (src/model/router_skew.h) that sends the reference models' rows to 2 of their 8
// experts: the same weights and FLOPs, 6 experts fewer touched a layer.
constexpr float kTouchedExpertSkew = 16.0f;

// The reference models of the calibration widths (32, 128 and 256: narrow models, where per-call
// costs weigh, to matrices wide enough for the kernels' blocking), initialized, in `device`'s
// arena.
std::vector<std::unique_ptr<Transformer<float>>> reference_models(Device& device,
                                                                  bool with_gradients) {
  std::vector<std::unique_ptr<Transformer<float>>> models;
  for (int width : {32, 128, 256}) {
    models.push_back(std::make_unique<Transformer<float>>(reference_model(width), device.ops(),
                                                          device.memory(), with_gradients));
    models.back()->initialize(1);
  }
  return models;
}

// Least squares of 1 / rate = a + b / rows + c / width (a = 1 / peak, b = half_rows / peak,
// c = half_width / peak), each equation scaled by its rate so every point counts by its relative
// error. A coefficient that comes out negative (noise: no loss along that dimension) is dropped
// and the rest refitted.
void fit_rates(LayerRates& r) {
  bool use_rows = true, use_width = true;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const int n = int(r.measured.size());
    const int k = 1 + int(use_rows) + int(use_width);
    Eigen::MatrixXd a(n, k);
    Eigen::VectorXd y(n);
    for (int i = 0; i < n; ++i) {
      const LayerRates::Point& p = r.measured[size_t(i)];
      int col = 0;
      a(i, col++) = p.rate;
      if (use_rows) a(i, col++) = p.rate / p.rows;
      if (use_width) a(i, col++) = p.rate / p.model_width;
      y(i) = 1;
    }
    const Eigen::VectorXd x = a.colPivHouseholderQr().solve(y);
    const double b = use_rows ? x(1) : 0, c = use_width ? x(k - 1) : 0;
    if (x(0) > 0 && b >= 0 && c >= 0) {
      r.peak = 1 / x(0);
      r.half_rows = b * r.peak;
      r.half_width = c * r.peak;
      return;
    }
    if (b < 0) use_rows = false;
    if (c < 0) use_width = false;
  }
  // No size dependence to fit (a noisy machine): the best rate at every size.
  for (const LayerRates::Point& p : r.measured) r.peak = std::max(r.peak, p.rate);
}

// The measured points as a grid (every width measured at every row count), which the cost model
// interpolates inside and extends by the fit outside (sim::RateTable).
sim::RateTable rate_table(const LayerRates& r) {
  sim::RateTable t;
  for (const LayerRates::Point& p : r.measured) {
    if (std::find(t.rows.begin(), t.rows.end(), double(p.rows)) == t.rows.end())
      t.rows.push_back(p.rows);
    if (std::find(t.widths.begin(), t.widths.end(), p.model_width) == t.widths.end())
      t.widths.push_back(p.model_width);
  }
  std::sort(t.rows.begin(), t.rows.end());
  std::sort(t.widths.begin(), t.widths.end());
  t.rates.assign(t.rows.size() * t.widths.size(), 0);
  for (const LayerRates::Point& p : r.measured) {
    const size_t i =
        size_t(std::find(t.rows.begin(), t.rows.end(), double(p.rows)) - t.rows.begin());
    const size_t j =
        size_t(std::find(t.widths.begin(), t.widths.end(), p.model_width) - t.widths.begin());
    t.rates[j * t.rows.size() + i] = p.rate;
  }
  return t;
}

// FLOP/s of the runtime's own layers against the rows (tokens) a call processes and the width of
// its matrices, and a row's work beyond its FLOPs. Forward + backward of reference models of width
// 32, 128 and 256 on 1, 4, 16 and 64 sequences of 16 tokens, and of the width-32 model with
// experts and a shared FFN of width 8 instead of 64 (a third of the FLOPs a row, the same rows),
// FLOPs counted by the cost model's formula.
// - The row work (`row_seconds`: sim::ClusterConfig::row_seconds, a row a layer): at each row
//   count the two width-32 models' times give the seconds a FLOP costs (their difference over
//   their FLOPs' difference), and what the reference model's time holds beyond its FLOPs at that
//   rate is its rows' work; the mean of the two largest row counts', at least 0. A difference of
//   two times, so timed with 3 x the repeats, and from each case's fastest run, not its median:
//   on a busy machine (three spinning processes on the 2 cores, 2026-12-06) the medians put it at
//   4.7-2073 ns over eight calibrations (below 100 ns in two; at 0, so the rows' work went into
//   the rates, in two of six others), the fastest runs at 1429-2911 ns; on the idle machine the
//   two agree within 3-14% (1297-1461 against 1479-1509 ns, four calibrations). Measured at the
//   narrowest width, where it weighs (a third of the width-32 model's time, 2026-12-05): at widths
//   128 and 256 it is a few percent of the time, below what a difference of times resolves, and
//   the cost model charges the same work a row at every width. (A model with twice the FLOPs a row,
//   d_ff 128, as the second point put the row work anywhere in 0.8-4.3 us over eight calibrations
//   on the idle machine; the lighter one, where the row work is most of the time, in 1.1-1.5 us
//   over five.)
// - The touched experts' cost (`active_expert_seconds`: sim::ClusterConfig, an expert a layer,
//   by the expert's bytes): each reference model again with a skewed router (kTouchedExpertSkew,
//   the same weights and FLOPs) on 16 and 64 rows; the plain model's time less the skewed one's
//   (fastest runs) over the experts fewer it touched (counted from the router's statistics) and
//   its layers, the mean of the two, at least 0. A CPU reads an expert's weights and writes its
//   gradients once a call whatever its rows: on this machine (2026-12-06, 20 calibrations)
//   0.45-0.61 ms an expert at width 256 (1.5 MB an expert), 0.11-0.14 ms at width 128, 3-9 us at
//   width 32 (in cache). At 256 rows the difference was too small a share of the time to repeat.
//   The width-32 reference's is taken out of the row work's two times.
// - A forward's share of the row work (`forward_row_seconds`): the width-32 reference model's
//   forward alone at the two largest row counts, timed with the others; what it takes beyond a
//   third of the forward + backward's time, a row a layer, added to a third of the row work (the
//   FLOPs and touched experts counted a third a pass, the rest being the rows'), the mean of the
//   two, within [0, row work]. On this machine (2026-12-06) `tiny`'s forward took 0.37-0.39 of
//   its forward + backward (its prefill as much), so a third of the row work left its prefill
//   14-17% short.
// - The rates: the reference models' times less both, fitted (fit_rates) to
//   rate = peak / (1 + half_rows / rows + half_width / width), Hockney's law in both dimensions.
LayerRates measure_layer_rates(Device& device, int repeats) {
  const int length = 16;
  const int sequence_counts[] = {1, 4, 16, 64};
  // The skewed copies' row counts (see above): 16 and 64 rows.
  const int skewed_sequence_counts[] = {1, 4};
  struct Case {
    Transformer<float>* model;
    int sequences;
    std::vector<int> ids, offsets;
    std::vector<float> dlogits;
  };
  const Arena::Mark mark = device.memory().mark();
  std::vector<std::unique_ptr<Transformer<float>>> models = reference_models(device, true);
  const size_t reference_count = models.size();
  // Then the width-32 model with d_ff 8 (its cases follow the reference models').
  models.push_back(std::make_unique<Transformer<float>>(reference_model(32, 8), device.ops(),
                                                        device.memory(), true));
  models.back()->initialize(1);
  // Then each reference model again with a skewed router, the same weights: its rows go to 2
  // experts of 8 (their cases last, at the skewed row counts only).
  for (size_t k = 0; k < reference_count; ++k) {
    ModelConfig skewed = models[k]->config();
    skewed.router_skew = kTouchedExpertSkew;
    models.push_back(
        std::make_unique<Transformer<float>>(skewed, device.ops(), device.memory(), true));
    models.back()->initialize(1);
  }
  std::vector<Case> cases;
  for (size_t k = 0; k < models.size(); ++k) {
    const int vocab = models[k]->config().vocab_size;
    const bool skewed = k > reference_count;
    for (int sequences : sequence_counts) {
      if (skewed && std::find(std::begin(skewed_sequence_counts), std::end(skewed_sequence_counts),
                              sequences) == std::end(skewed_sequence_counts))
        continue;
      Case c{models[k].get(), sequences, {}, {}, {}};
      const int tokens = sequences * length;
      for (int i = 0; i < tokens; ++i) c.ids.push_back((i * 7 + 3) % vocab);
      for (int q = 0; q <= sequences; ++q) c.offsets.push_back(q * length);
      c.dlogits.assign(size_t(tokens) * size_t(vocab), 1.0f / tokens);
      cases.push_back(std::move(c));
    }
  }
  // Interleaved, so the machine's drift (other jobs) hits every size alike.
  std::vector<std::function<void()>> bodies;
  for (Case& c : cases) {
    bodies.push_back([&c] {
      c.model->forward(c.ids.data(), c.offsets.data(), c.sequences);
      c.model->backward(c.dlogits.data(), 0.0f);
    });
  }
  // Then the width-32 reference's forward alone at its two largest row counts (cases
  // large_first.. of the first model), timed after the cases above.
  const size_t per_model = std::size(sequence_counts);
  const size_t large_first = per_model - 2;
  for (size_t i = large_first; i < per_model; ++i) {
    bodies.push_back([&c = cases[i]] {
      c.model->forward(c.ids.data(), c.offsets.data(), c.sequences);
      c.model->release_activations();
    });
  }
  const std::vector<std::vector<double>> samples = time_interleaved_samples(bodies, 3 * repeats);
  std::vector<double> seconds, fastest;
  for (const std::vector<double>& s : samples) {
    seconds.push_back(median(s));
    fastest.push_back(*std::min_element(s.begin(), s.end()));
  }
  auto flops_of = [&](size_t i) {
    const sim::ModelShape shape = sim::model_shape(cases[i].model->config());
    return cases[i].sequences * length * sim::forward_flops_per_token(shape, 0.5 * (length + 1)) *
           3;
  };
  auto rows_of = [&](size_t i) {
    return double(cases[i].sequences) * length * cases[i].model->config().n_layers;
  };
  // The experts a case's forward touches, a layer on average (the count `train` reports).
  auto touched_of = [&](size_t i) {
    Transformer<float>& model = *cases[i].model;
    model.take_touched_experts();  // the timed runs'
    model.forward(cases[i].ids.data(), cases[i].offsets.data(), cases[i].sequences);
    const Transformer<float>::TouchedExperts touched = model.take_touched_experts();
    return touched.calls > 0 ? double(touched.touched) / double(touched.calls) : 0.0;
  };
  const size_t light_first = reference_count * per_model;  // the reference cases: from 0
  const size_t skewed_first = light_first + per_model;
  const size_t per_skewed = std::size(skewed_sequence_counts);
  LayerRates r;
  // The touched experts' cost, a reference model at a time: its time less the skewed copy's at
  // the same rows, over the experts fewer and its layers.
  std::vector<double> touched(cases.size(), 0);
  for (size_t i = 0; i < cases.size(); ++i) touched[i] = touched_of(i);
  std::vector<double> expert_seconds(reference_count, 0);
  for (size_t k = 0; k < reference_count; ++k) {
    const ModelConfig& config = models[k]->config();
    for (size_t j = 0; j < per_skewed; ++j) {
      const size_t skewed = skewed_first + k * per_skewed + j;
      const size_t plain =
          k * per_model + size_t(std::find(std::begin(sequence_counts), std::end(sequence_counts),
                                           cases[skewed].sequences) -
                                 std::begin(sequence_counts));
      const double fewer = touched[plain] - touched[skewed];
      if (fewer > 0)
        expert_seconds[k] +=
            std::max(0.0, (fastest[plain] - fastest[skewed]) / (fewer * config.n_layers)) /
            double(per_skewed);
    }
    r.expert_bytes.push_back(3.0 * config.d_model * config.d_ff * sizeof(float));
    r.expert_seconds.push_back(expert_seconds[k]);
  }
  auto touched_seconds = [&](size_t i) {  // a reference case's touched experts
    const size_t k = i / per_model;
    return touched[i] * cases[i].model->config().n_layers * expert_seconds[k];
  };
  // At 256 and 1024 rows: at fewer, each call's fixed cost (which differs between the two
  // models' kernels) is a share of the time as well, and would come out as row work. The width-32
  // reference's touched experts are taken out of both models' times (the light model's experts,
  // smaller still, cost as little at that width).
  double per_row = 0;
  for (size_t i = large_first; i < per_model; ++i) {
    const size_t light = light_first + i;
    const double experts = touched_seconds(i);
    const double seconds_per_flop = (fastest[i] - fastest[light]) / (flops_of(i) - flops_of(light));
    per_row += (fastest[i] - experts - seconds_per_flop * flops_of(i)) / rows_of(i) /
               double(per_model - large_first);
  }
  const double row_seconds = std::max(0.0, per_row);
  r.row_seconds = row_seconds;
  double forward_per_row = 0;
  for (size_t i = large_first; i < per_model; ++i) {
    const double forward = fastest[cases.size() + (i - large_first)];
    forward_per_row += (row_seconds / 3 + (forward - fastest[i] / 3) / rows_of(i)) /
                       double(per_model - large_first);
  }
  r.forward_row_seconds = std::clamp(forward_per_row, 0.0, row_seconds);
  for (size_t i = 0; i < light_first; ++i) {
    const ModelConfig& config = cases[i].model->config();
    // What the FLOPs took: the time less the rows' work and the touched experts'. That work is a
    // mean over row counts, so a noisy point's time could come out below it: a quarter of the
    // time bounds it.
    const double flop_seconds =
        std::max(seconds[i] - rows_of(i) * row_seconds - touched_seconds(i), 0.25 * seconds[i]);
    r.measured.push_back({config.d_model, cases[i].sequences * length,
                          sim::model_shape(config).width, flops_of(i) / flop_seconds});
  }
  models.clear();
  device.memory().release(mark);
  fit_rates(r);
  return r;
}

// Generation's rates: a decode step (one token for each of B sequences, attending to 16 cached
// positions) of the same reference models at B = 1, 8, 16, 32, 64, 128 and 256 (a rank's batch of
// a step's samples is often past 64; a step's long tail decodes a few dozen rows), FLOPs counted by
// the cost model's formula at context 17, fitted like the layer rates (fit_rates). The cases are
// timed interleaved, each timed step right after an untimed one of the same case, as the runtime
// decodes one model's steps back to back: timed after the other cases' steps instead, the width-32
// and width-128 models' steps took 1.4-6.9x longer than back to back (2026-12-05, their weights
// evicted by the width-256 model's), which put the planner's decode of `tiny` at 2-6x its measured
// time. Rows 16, 32 and 128 since 2026-12-06: the rates there ran 10% (width 32) to 27% (width 128,
// 16 rows) above the log-log interpolation between 8, 64 and 256 rows, which had put `small`'s
// generation 10% high.
LayerRates measure_decode_rates(Device& device, int repeats) {
  const int context = 16;
  const int batches[] = {1, 8, 16, 32, 64, 128, 256};
  struct Case {
    Transformer<float>* model;
    KVCache<float> cache;
    int batch;
    std::vector<int> tokens, slots, positions;
  };
  const Arena::Mark mark = device.memory().mark();
  std::vector<std::unique_ptr<Transformer<float>>> models = reference_models(device, false);
  std::vector<Case> cases;
  for (const auto& owned : models) {
    Transformer<float>& model = *owned;
    for (int batch : batches) {
      Case c{&model, model.allocate_kv_cache(batch, context + 1), batch, {}, {}, {}};
      std::vector<int> prompt, offsets{0};
      for (int b = 0; b < batch; ++b) {
        for (int t = 0; t < context; ++t) prompt.push_back((b * 5 + t * 3 + 1) % 64);
        offsets.push_back(int(prompt.size()));
        c.tokens.push_back(b % 64);
        c.slots.push_back(b);
        c.positions.push_back(context);
      }
      const Arena::Mark before_prefill = device.memory().mark();
      model.prefill(c.cache, prompt.data(), offsets.data(), batch, c.slots.data());
      device.memory().release(before_prefill);  // the cache keeps the prefix
      cases.push_back(std::move(c));
    }
  }
  const Arena::Mark top = device.memory().mark();
  std::vector<std::function<void()>> bodies;
  for (Case& c : cases) {
    bodies.push_back([&c, &device, top] {
      c.model->decode(c.cache, c.tokens.data(), c.slots.data(), c.positions.data(), c.batch);
      device.memory().release(top);
    });
  }
  const std::vector<double> seconds = time_interleaved_warm(bodies, repeats);
  LayerRates r;
  for (size_t i = 0; i < cases.size(); ++i) {
    const sim::ModelShape shape = sim::model_shape(cases[i].model->config());
    const double rate =
        cases[i].batch * sim::forward_flops_per_token(shape, context + 1) / seconds[i];
    r.measured.push_back({cases[i].model->config().d_model, cases[i].batch, shape.width, rate});
  }
  cases.clear();
  models.clear();
  device.memory().release(mark);
  fit_rates(r);
  return r;
}

// The optimizer step as the runtime takes it (Ops' gradient norm, then AdamW's update), float32,
// the four buffers (parameters, gradients, two moments) one after the other in the device arena as
// the runtime's are, at three parameter counts: 2^16, 2^22 and 2^25, each + 1000.
// - Three counts, because the four streams run from the caches while they fit: on this VM (one
//   core, 2026-12-06) 2^22 + 1000 parameters (64 MiB of states, partly in its 300 MiB L3) ran at
//   8.4-9.1e8 parameters/s, 27.84M (`small`, 445 MiB) at 6.4e8, in the same layout and in the
//   runtime's own AdamW on `small` (6.3e8). Written as optimizer_parameters /
//   optimizer_parameter_seconds, which the cost model interpolates; optimizer_rate is the middle
//   count's rate. A count whose buffers do not fit in the arena's free space is left out.
// - + 1000, not a power of two: with 2^22 the four buffers start a power-of-two stride (16 MiB)
//   apart, their streams fall on the same cache sets, and they ran at 2.7-3.1e8 parameters/s
//   against 8.4-9.1e8 with 2^22 + 1000, back to back (offsets of 64 to 4099 parameters as fast).
//   A model's parameter count is no such stride. (Four separate heap vectors, page-aligned, ran at
//   about half the arena's rate in some calibrations and not in others before: likely the same.)
constexpr int64_t kOptimizerCalibrationParameters[] = {
    (int64_t(1) << 16) + 1000, (int64_t(1) << 22) + 1000, (int64_t(1) << 25) + 1000};
constexpr int64_t kOptimizerRateParameters = kOptimizerCalibrationParameters[1];

struct OptimizerCost {
  double rate = 0;  // parameters per second at kOptimizerRateParameters
  std::vector<double> parameters, parameter_seconds;  // each measured count's seconds a parameter
};

// Seconds a parameter of one optimizer step over `n` parameters.
double optimizer_parameter_seconds(Device& device, int64_t n, int repeats) {
  const size_t count = size_t(n);
  Arena& arena = device.memory();
  ArenaScope scope(arena);
  float* param = arena.allocate<float>(count, "optimizer calibration");
  float* grad = arena.allocate<float>(count, "optimizer calibration");
  float* m = arena.allocate_zeroed<float>(count, "optimizer calibration");
  float* v = arena.allocate_zeroed<float>(count, "optimizer calibration");
  std::fill_n(param, count, 0.5f);
  for (int64_t i = 0; i < n; ++i) grad[size_t(i)] = philox_uniform(5, 1, uint64_t(i)) - 0.5f;
  const Ops<float>& ops = device.ops();
  int step = 0;
  // Steps of at least ~1M parameters a timing: the smallest count's step takes tens of us.
  const int64_t steps = std::max<int64_t>(1, (int64_t(1) << 20) / n);
  const double seconds = seconds_of(
      [&] {
        for (int64_t k = 0; k < steps; ++k) {
          const double norm = std::sqrt(ops.grad_norm_squared(grad, n, arena));
          ops.adamw_update(param, grad, m, v, n, AdamWHyper{}, ++step, clip_scale(norm, 1.0f),
                           arena);
        }
      },
      repeats);
  return seconds / double(steps * n);
}

OptimizerCost measure_optimizer(Device& device, int repeats) {
  OptimizerCost cost;
  const Arena& arena = device.memory();
  for (const int64_t n : kOptimizerCalibrationParameters) {
    // Four buffers, each rounded up to the arena's alignment, and the norm's partials.
    const size_t bytes = 4 * (size_t(n) * sizeof(float) + Arena::kAlignment) + (size_t(1) << 20);
    if (bytes > arena.capacity() - arena.used()) continue;
    const double seconds = optimizer_parameter_seconds(device, n, repeats);
    cost.parameters.push_back(double(n));
    cost.parameter_seconds.push_back(seconds);
    if (n == kOptimizerRateParameters) cost.rate = 1 / seconds;
  }
  if (cost.rate == 0)
    throw ConfigError(
        "bench calibrate: --device-memory is too small for the optimizer's "
        "calibration (4 x 16 MiB of buffers)");
  return cost;
}

struct SamplerRate {
  double rate = 0, sort_rate = 0;
  std::vector<double> vocab, row_seconds;  // each vocabulary's measured seconds a row
};

// The sampler (temperature 1, top-p 0.9) on 64 rows of V = 16, 32, 64, 256, 1024 and 4096 logits,
// timed interleaved: each vocabulary's seconds a row (written as sampler_vocab /
// sampler_row_seconds, which the cost model interpolates), and the time per entry,
// 1 / rate + log2 V / sort_rate, fitted by least squares of the relative error (a coefficient the
// noise makes negative is left out and the other refitted), which scales them past their ends.
// Every call samples fresh logits (the next block of a pool of 4 MiB a vocabulary, at least 4
// blocks), as the runtime's do: sampling the same rows again and again, the branch predictor
// learns their sort, and V = 16-64 ran 1.4-2.1x faster than on fresh rows (2026-12-06: V = 32 at
// 0.40 against 0.80 us a row, one thread; `tiny`'s generation loop took 1.0), which put the
// sampler of a small vocabulary at half its cost in the runs.
SamplerRate measure_sampler(Device& device, int repeats) {
  const int rows = 64, calls = 10;
  const int vocabularies[] = {16, 32, 64, 256, 1024, 4096};
  const size_t pool_bytes = size_t(4) << 20;
  struct Case {
    int vocab;
    size_t blocks, next = 0;
    std::vector<float> logits;  // `blocks` blocks of rows x vocab
  };
  std::vector<Case> cases;
  for (int vocab : vocabularies) {
    const size_t block = size_t(rows) * size_t(vocab);
    const size_t blocks = std::max<size_t>(4, pool_bytes / (block * sizeof(float)));
    Case c{vocab, blocks, 0, std::vector<float>(blocks * block)};
    for (size_t i = 0; i < c.logits.size(); ++i) c.logits[i] = 4 * philox_uniform(3, 2, i);
    cases.push_back(std::move(c));
  }
  std::vector<int> tokens(rows), positions(rows, 1);
  std::vector<float> logp(rows);
  std::vector<int64_t> ids(rows);
  for (int b = 0; b < rows; ++b) ids[size_t(b)] = b;
  std::vector<std::function<void()>> bodies;
  for (Case& c : cases) {
    bodies.push_back([&] {
      for (int i = 0; i < calls; ++i) {
        const float* logits = c.logits.data() + c.next * size_t(rows) * size_t(c.vocab);
        c.next = (c.next + 1) % c.blocks;
        ArenaScope scope(device.memory());
        cpu::sample_tokens(tokens.data(), logp.data(), logits, ids.data(), positions.data(), rows,
                           c.vocab, 1, 1.0f, 0.9f, device.memory());
      }
    });
  }
  const std::vector<double> seconds = time_interleaved(bodies, repeats);
  const int n = int(cases.size());
  std::vector<double> per_entry(cases.size(), 0.0), log_vocab(cases.size(), 0.0);
  for (int i = 0; i < n; ++i) {
    per_entry[size_t(i)] = seconds[size_t(i)] / (calls * rows * double(cases[size_t(i)].vocab));
    log_vocab[size_t(i)] = std::log2(double(cases[size_t(i)].vocab));
  }
  // Relative least squares with the basis (1, log2 V), or one of them alone.
  auto fit = [&](bool entries, bool sort) {
    Eigen::MatrixXd a(n, int(entries) + int(sort));
    const Eigen::VectorXd y = Eigen::VectorXd::Ones(n);
    for (int i = 0; i < n; ++i) {
      int col = 0;
      if (entries) a(i, col++) = 1 / per_entry[size_t(i)];
      if (sort) a(i, col++) = log_vocab[size_t(i)] / per_entry[size_t(i)];
    }
    const Eigen::VectorXd x = a.colPivHouseholderQr().solve(y);
    SamplerRate s;
    s.rate = entries ? 1 / x(0) : 1e300;
    s.sort_rate = sort ? 1 / x(int(entries)) : 1e300;
    return s;
  };
  const SamplerRate both = fit(true, true);
  SamplerRate s = both.rate > 0 && both.sort_rate > 0 ? both
                  : both.sort_rate > 0                ? fit(false, true)
                                                      : fit(true, false);
  for (int i = 0; i < n; ++i) {
    s.vocab.push_back(cases[size_t(i)].vocab);
    s.row_seconds.push_back(per_entry[size_t(i)] * cases[size_t(i)].vocab);
  }
  return s;
}

// The work before each operation of the expert exchange's second lock-step loop: the runtime's
// forward of the width-32 reference model on 4 sequences of 16 tokens (64 rows, the order of a
// tiny model's micro-batch between two MoE exchanges), its activations released after each call.
class ReferenceForward {
 public:
  explicit ReferenceForward(Device& device)
      : device_(device),
        mark_(device.memory().mark()),
        model_(std::make_unique<Transformer<float>>(reference_model(32), device.ops(),
                                                    device.memory(), false)) {
    model_->initialize(1);
    const int vocab = model_->config().vocab_size;
    for (int i = 0; i < kSequences * kLength; ++i) ids_.push_back((i * 7 + 3) % vocab);
    for (int q = 0; q <= kSequences; ++q) offsets_.push_back(q * kLength);
    top_ = device.memory().mark();
  }
  ~ReferenceForward() {
    model_.reset();
    device_.memory().release(mark_);
  }
  ReferenceForward(const ReferenceForward&) = delete;
  ReferenceForward& operator=(const ReferenceForward&) = delete;
  void run() {
    model_->forward(ids_.data(), offsets_.data(), kSequences);
    device_.memory().release(top_);
  }

 private:
  static constexpr int kSequences = 4, kLength = 16;
  Device& device_;
  Arena::Mark mark_, top_ = 0;
  std::unique_ptr<Transformer<float>> model_;
  std::vector<int> ids_, offsets_;
};

struct CopyRates {
  double read_write = 0;  // memcpy: bytes read + written per second
  double streamed = 0;    // the offload's streaming copy: bytes moved per second
};

// memcpy of 128 MiB (read + write: sim::ClusterConfig::memory_bandwidth), and the copy that
// TrainingOffload moves AdamW's moments with (copy_bytes_streaming: sim::ClusterConfig::
// host_bandwidth, bytes moved) on the same buffers. glibc's memcpy changes its stores with the
// size (on this VM 7.2-7.8 GB/s moved at 48-112 MiB, 11-12 from 120 MiB: kernels/
// streaming_copy.h), so the offload is timed with its own copy, not with memcpy's rate at 128 MiB.
CopyRates measure_copy_bandwidth(int repeats) {
  const size_t bytes = size_t(128) << 20;
  std::vector<char> from(bytes, 1), to(bytes, 0);
  CopyRates rates;
  const double copied = seconds_of([&] { std::memcpy(to.data(), from.data(), bytes); }, repeats);
  rates.read_write = 2.0 * double(bytes) / copied;
  const double streamed =
      seconds_of([&] { copy_bytes_streaming(to.data(), from.data(), bytes); }, repeats);
  rates.streamed = double(bytes) / streamed;
  return rates;
}

struct LinkMeasure {
  double bandwidth = 0, latency = 0;
};

// Ping-pong between world ranks 0 and 1 on two virtual nodes through Links (its counting,
// emulation and back-off waits); medians of the half round trips.
LinkMeasure ping_pong(const LinkEmulation& emulation, int repeats) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<int> nodes(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) nodes[size_t(r)] = r;
  Links links(nodes, emulation);
  auto half_round_trip = [&](uint64_t bytes, int times) {
    std::vector<char> buffer(bytes, 1);
    std::vector<double> samples;
    for (int i = 0; i < times + 1; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double start = MPI_Wtime();
      if (rank == 0) {
        links.send(buffer.data(), bytes, 1, 11, MPI_COMM_WORLD);
        links.recv(buffer.data(), bytes, 1, 12, MPI_COMM_WORLD);
      } else if (rank == 1) {
        links.recv(buffer.data(), bytes, 0, 11, MPI_COMM_WORLD);
        links.send(buffer.data(), bytes, 0, 12, MPI_COMM_WORLD);
      }
      if (i > 0) samples.push_back(0.5 * (MPI_Wtime() - start));
    }
    double t = median(samples);
    MPI_Bcast(&t, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    return t;
  };
  LinkMeasure m;
  m.latency = half_round_trip(8, 20 * repeats);
  const uint64_t big = uint64_t(4) << 20;
  m.bandwidth = double(big) / std::max(1e-9, half_round_trip(big, repeats) - m.latency);
  return m;
}

// One row of the table: quantity, value with `decimals` (-1: 4 significant digits), unit, method.
void quantity(const char* name, double value, int decimals, const char* unit,
              const std::string& method) {
  if (decimals < 0)
    std::printf("  %-22s %14.4g %-8s %s\n", name, value, unit, method.c_str());
  else
    std::printf("  %-22s %14.*f %-8s %s\n", name, decimals, value, unit, method.c_str());
}

}  // namespace

int run_bench_calibrate_command(const std::vector<std::string>& args) {
  RunOptions run;
  std::string output = "runs/calibrate/cluster.ini", name = "calibrated";
  int repeats = 5;
  LinkEmulation emulation;
  po::options_description description = run_options_description(run);
  po::options_description bench("bench calibrate");
  auto add = bench.add_options();
  add("output", po::value(&output)->default_value(output), "cluster file to write");
  add("name", po::value(&name)->default_value(name), "the cluster's name in the file");
  add("repeats", po::value(&repeats)->default_value(repeats), "timed repeats (median, >= 3)");
  add("inter-node-bandwidth", po::value(&emulation.inter_node_bandwidth)->default_value(0),
      "emulated inter-node bandwidth (bytes/s) to measure as the inter-node link");
  add("inter-node-latency", po::value(&emulation.inter_node_latency)->default_value(0),
      "emulated inter-node latency (s)");
  description.add(bench);
  if (!parse_options("bench calibrate", args, description, run)) return 0;
  if (repeats < 3) throw ConfigError("--repeats must be >= 3, got " + std::to_string(repeats));
  emulation.validate();
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  if (ranks > 2) throw ConfigError("bench calibrate runs on 1 rank, or 2 for the link ping-pong");

  // The device's thread limit holds while it lives: the kernels run on this rank's threads only.
  Device device(Backend::Cpu, run.device_memory_bytes(), resolve_threads(run.threads));
  const Matmul matmul = measure_matmul(device.memory(), repeats);
  const double kernel_overhead = measure_kernel_overhead(device, repeats);
  const LayerRates layers = measure_layer_rates(device, repeats);
  const LayerRates decode = measure_decode_rates(device, repeats);
  const CopyRates copy_rates = measure_copy_bandwidth(repeats);
  const double copy = copy_rates.read_write;
  const OptimizerCost optimizer = measure_optimizer(device, repeats);
  const SamplerRate sampler = measure_sampler(device, repeats);
  sim::ClusterConfig c;
  c.name = name;
  c.devices_per_node = ranks;
  c.nodes_per_supernode = 1;
  c.supernodes = 1;
  c.matmul_flops = layers.peak;
  c.half_rate_rows = layers.half_rows;
  c.half_rate_width = layers.half_width;
  c.decode_flops = decode.peak;
  c.decode_half_rate_rows = decode.half_rows;
  c.decode_half_rate_width = decode.half_width;
  c.layer_table = rate_table(layers);
  c.row_seconds = layers.row_seconds;
  c.forward_row_seconds = layers.forward_row_seconds;
  c.active_expert_bytes = layers.expert_bytes;
  c.active_expert_seconds = layers.expert_seconds;
  c.decode_table = rate_table(decode);
  c.optimizer_rate = optimizer.rate;
  c.optimizer_parameters = optimizer.parameters;
  c.optimizer_parameter_seconds = optimizer.parameter_seconds;
  c.sampler_rate = sampler.rate;
  c.sampler_sort_rate = sampler.sort_rate;
  c.sampler_vocab = sampler.vocab;
  c.sampler_row_seconds = sampler.row_seconds;
  c.kernel_overhead = kernel_overhead;
  c.memory_bytes = double(run.device_memory_bytes());
  c.memory_bandwidth = copy;
  // Host and device share the memory here: moving B bytes to host memory is the offload's copy,
  // timed as it runs (bytes moved per second).
  c.host_bandwidth = copy_rates.streamed;
  std::string intra_method = "one rank: copy bandwidth, no latency";
  c.intra_node = {copy, 0};
  if (ranks == 2) {
    const LinkMeasure intra = ping_pong(LinkEmulation{}, repeats);
    c.intra_node = {intra.bandwidth, intra.latency};
    intra_method = "MPI ping-pong, 2 ranks, Links";
  }
  ExpertExchangeCost exchange;
  if (ranks == 2) {
    ReferenceForward forward(device);
    exchange = measure_expert_exchange(c.intra_node, repeats, [&forward] { forward.run(); });
    c.expert_exchange_overhead = exchange.forward.overhead;
    c.expert_exchange_row_seconds = exchange.forward.row_seconds;
    c.expert_backward_overhead = exchange.backward.overhead;
    c.expert_backward_row_seconds = exchange.backward.row_seconds;
    c.expert_exchange_lockstep = exchange.lockstep;
    c.expert_exchange_spread = exchange.spread;
  }
  ReplicaHandoffCost handoffs;
  if (ranks == 2) {
    handoffs = measure_replica_handoffs(repeats);
    c.queue_handoff = handoffs.queue.cost;
    c.replica_allgather = handoffs.allgather.cost;
  }
  c.intra_supernode = c.inter_supernode = c.intra_node;
  std::string inter_method = "no emulation: as intra-node";
  if (ranks == 2 && emulation.enabled()) {
    const LinkMeasure inter = ping_pong(emulation, repeats);
    c.intra_supernode = c.inter_supernode = {inter.bandwidth, inter.latency};
    inter_method = "MPI ping-pong through link emulation";
  }
  if (rank != 0) return 0;
  const bool matmul_ok = matmul.nmse <= 1e-8;
  char comment[4096];
  std::snprintf(
      comment, sizeof comment,
      "Written by `rlfusion bench calibrate` (%s): rates measured on this machine, %d "
      "rank(s), %d thread(s) each.\nmatmul_flops, half_rate_rows, half_rate_width: fit of "
      "forward + backward rates of reference models (width 32, 128 and 256, 8 experts, d_ff 2 x "
      "the width) on 16 .. 1024 rows, their rows' work beyond the FLOPs taken out; row_seconds: "
      "that work, a row a layer, from the width-32 model against itself with d_ff 8; "
      "forward_row_seconds: a forward's share of it, from the width-32 model's forward alone; "
      "layer_rate_* and decode_rate_*: the measured points the fits were made of; "
      "kernel overhead from a 1-token forward of a 1-layer d_model-8 model; "
      "optimizer_rate: gradient norm + AdamW over 4M + 1000 parameters in the device arena; "
      "optimizer_parameter_seconds: the same, seconds a parameter, at 64K, 4M and 32M + 1000; "
      "sampler: "
      "top-p sampling of 64 fresh "
      "rows at V = 16 .. 4096; copy bandwidth from memcpy of 128 MiB; host bandwidth from the "
      "offload's streaming copy of 128 MiB; links: %s; %s; "
      "expert exchange (2 ranks): the runtime's dispatcher, 8 and 256 tokens top-2 of 4 experts, "
      "beyond the link time; its lock-step cost: each operation after equal work on both ranks, "
      "beyond the work and the operation alone; its spread: the same after the forward of the "
      "width-32 reference model on 64 rows, beyond the lock-step, per second of that work; "
      "queue hand-off (2 ranks): a fused pipeline's rollouts through DistQueue (put, barrier, "
      "the leader's get and fan-out, barrier: the runtime's pipeline_rollouts) and replica "
      "allgather (StaleSync's allgather_rollouts), 32 and 256 short samples and 32 long, per "
      "hand-off, sample and packed byte.",
      build_info().c_str(), ranks, resolve_threads(run.threads), intra_method.c_str(),
      inter_method.c_str());
  const std::string text = sim::cluster_config_ini(c, comment);
  const std::filesystem::path path(output);
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  std::ofstream(output) << text;
  sim::load_cluster_config(output);  // what was written reads back
  if (run.json) {
    std::printf(
        "{\"command\":\"bench "
        "calibrate\",\"matmul_flops\":%.6g,\"half_rate_rows\":%.6g,\"half_rate_width\":%.6g,"
        "\"decode_flops\":%.6g,\"decode_half_rate_rows\":%.6g,\"decode_half_rate_width\":%.6g,"
        "\"optimizer_rate\":%.6g,\"optimizer_rate_parameters\":%lld,\"sampler_rate\":%.6g,"
        "\"sampler_sort_rate\":%.6g,"
        "\"matmul_nmse\":%.3g,"
        "\"kernel_overhead_s\":%.6g,\"memory_bandwidth\":%.6g,\"intra_node_bandwidth\":%.6g,"
        "\"intra_node_latency_s\":%.6g,\"inter_node_bandwidth\":%.6g,"
        "\"inter_node_latency_s\":%.6g,\"expert_exchange_overhead_s\":%.6g,"
        "\"expert_exchange_row_seconds\":%.6g,\"expert_exchange_lockstep_s\":%.6g,"
        "\"expert_exchange_spread\":%.6g,"
        "\"expert_backward_overhead_s\":%.6g,\"expert_backward_row_seconds\":%.6g,"
        "\"row_seconds\":%.6g,\"forward_row_seconds\":%.6g,"
        "\"queue_handoff_overhead_s\":%.6g,\"queue_handoff_sample_seconds\":%.6g,"
        "\"queue_handoff_byte_seconds\":%.6g,\"replica_allgather_overhead_s\":%.6g,"
        "\"replica_allgather_sample_seconds\":%.6g,\"replica_allgather_byte_seconds\":%.6g,"
        "\"output\":\"%s\",\"ok\":%s}\n",
        c.matmul_flops, c.half_rate_rows, c.half_rate_width, c.decode_flops,
        c.decode_half_rate_rows, c.decode_half_rate_width, c.optimizer_rate,
        static_cast<long long>(kOptimizerRateParameters), c.sampler_rate, c.sampler_sort_rate,
        matmul.nmse, c.kernel_overhead, c.memory_bandwidth, c.intra_node.bandwidth,
        c.intra_node.latency, c.inter_supernode.bandwidth, c.inter_supernode.latency,
        c.expert_exchange_overhead, c.expert_exchange_row_seconds, c.expert_exchange_lockstep,
        c.expert_exchange_spread, c.expert_backward_overhead, c.expert_backward_row_seconds,
        c.row_seconds, c.forward_row_work(), c.queue_handoff.overhead,
        c.queue_handoff.sample_seconds, c.queue_handoff.byte_seconds, c.replica_allgather.overhead,
        c.replica_allgather.sample_seconds, c.replica_allgather.byte_seconds, output.c_str(),
        matmul_ok ? "true" : "false");
    return matmul_ok ? 0 : 1;
  }
  std::printf("# rlfusion bench calibrate: %s\n", build_info().c_str());
  std::printf("# %d rank(s), median of %d repeats\n", ranks, repeats);
  std::printf("# %-22s %14s %-8s %s\n", "quantity", "measured", "unit", "method");
  std::printf("  %-22s %14.2f %-8s %s (nmse vs reference %.1e)\n", "matmul 1024^3",
              matmul.rate / 1e9, "GFLOP/s", "cpu kernel, for comparison", matmul.nmse);
  for (const LayerRates::Point& p : layers.measured) {
    char what[64];
    std::snprintf(what, sizeof what, "layers w%d, %d rows", p.width, p.rows);
    std::printf(
        "  %-22s %14.2f %-8s fwd+bwd of the reference model, less row work and touched experts "
        "(fit: %.2f)\n",
        what, p.rate / 1e9, "GFLOP/s",
        sim::ClusterConfig::hockney(p.rows, p.model_width, c.matmul_flops, c.half_rate_rows,
                                    c.half_rate_width) /
            1e9);
  }
  for (const LayerRates::Point& p : decode.measured) {
    char what[64];
    std::snprintf(what, sizeof what, "decode w%d, %d rows", p.width, p.rows);
    std::printf("  %-22s %14.2f %-8s decode step of the reference model (fit: %.2f)\n", what,
                p.rate / 1e9, "GFLOP/s",
                sim::ClusterConfig::hockney(p.rows, p.model_width, c.decode_flops,
                                            c.decode_half_rate_rows, c.decode_half_rate_width) /
                    1e9);
  }
  quantity("row work", c.row_seconds * 1e9, 1, "ns",
           "a row a layer beyond its FLOPs, fwd+bwd: w32 model at d_ff 64 vs 8");
  quantity("forward row work", c.forward_row_work() * 1e9, 1, "ns",
           "its forward's share: the w32 model's forward alone vs a third of fwd+bwd");
  for (size_t k = 0; k < c.active_expert_bytes.size(); ++k) {
    char what[64];
    std::snprintf(what, sizeof what, "touched expert %.0f KiB", c.active_expert_bytes[k] / 1024);
    quantity(what, c.active_expert_seconds[k] * 1e6, 2, "us",
             "an expert a call touches, a layer fwd+bwd: plain vs skewed router");
  }
  if (c.row_seconds == 0)
    std::printf(
        "# warning: the row work came out at 0 (it is a difference of two timings, at least 0): "
        "the machine was busy; calibrate again on an idle node\n");
  quantity("layer peak (written)", c.matmul_flops / 1e9, 2, "GFLOP/s",
           "Hockney fit of the layer rates");
  quantity("half-rate rows", c.half_rate_rows, 1, "rows", "rows at half the peak (same fit)");
  quantity("half-rate width", c.half_rate_width, 1, "columns",
           "matrix width at half the peak (same fit)");
  quantity("decode peak", c.decode_flops / 1e9, 2, "GFLOP/s", "Hockney fit of the decode rates");
  quantity("decode half-rate rows", c.decode_half_rate_rows, 1, "rows", "same fit");
  quantity("decode half width", c.decode_half_rate_width, 1, "columns", "same fit");
  quantity("optimizer rate", c.optimizer_rate / 1e6, 2, "Mparam/s",
           "gradient norm + AdamW, 4M + 1000 parameters");
  for (size_t i = 0; i < c.optimizer_parameters.size(); ++i) {
    char what[64];
    std::snprintf(what, sizeof what, "optimizer at %.3gM", c.optimizer_parameters[i] / 1e6);
    quantity(what, c.optimizer_parameter_seconds[i] * 1e9, 3, "ns",
             "a parameter of a step over that many (written)");
  }
  // 1e300: that part of the fit left out (no measurable cost).
  quantity("sampler rate", c.sampler_rate, -1, "entry/s", "top-p sampling, V = 16 .. 4096");
  quantity("sampler sort rate", c.sampler_sort_rate, -1, "cmp/s",
           "same fit, V log2 V comparisons a row");
  for (size_t i = 0; i < c.sampler_vocab.size(); ++i) {
    char what[64];
    std::snprintf(what, sizeof what, "sampler V = %.0f", c.sampler_vocab[i]);
    quantity(what, c.sampler_row_seconds[i] * 1e6, 3, "us", "a row, fresh logits (written)");
  }
  quantity("kernel overhead", c.kernel_overhead * 1e6, 2, "us",
           "1-token forward of a 1-layer d_model-8 model / 21 calls");
  quantity("memory bandwidth", c.memory_bandwidth / 1e9, 2, "GB/s", "memcpy 128 MiB, read + write");
  quantity("host bandwidth", c.host_bandwidth / 1e9, 2, "GB/s",
           "the offload's streaming copy, 128 MiB, bytes moved");
  quantity("intra-node bandwidth", c.intra_node.bandwidth / 1e9, 3, "GB/s", intra_method);
  quantity("intra-node latency", c.intra_node.latency * 1e6, 2, "us", intra_method);
  quantity("inter-node bandwidth", c.inter_supernode.bandwidth / 1e9, 3, "GB/s", inter_method);
  quantity("inter-node latency", c.inter_supernode.latency * 1e6, 2, "us", inter_method);
  if (ranks == 2) {
    char method[160];
    // One fit's two lines: the fixed cost with the two batches it came from, and the cost per row.
    auto fit_lines = [&](const char* what, const char* operations, const ExchangeFit& fit) {
      std::snprintf(method, sizeof method,
                    "%s, %d / %d tokens: %.1f / %.1f us each, less link time", operations,
                    exchange.small_tokens, exchange.large_tokens, fit.small_seconds * 1e6,
                    fit.large_seconds * 1e6);
      quantity((std::string("EP ") + what + " overhead").c_str(), fit.overhead * 1e6, 2, "us",
               method);
      quantity((std::string("EP ") + what + " per row").c_str(), fit.row_seconds * 1e9, 2, "ns",
               "same fit");
    };
    fit_lines("exchange", "dispatch + combine", exchange.forward);
    fit_lines("backward", "their backward", exchange.backward);
    std::snprintf(method, sizeof method,
                  "%d tokens, each operation after equal work: %.1f us - work %.1f - alone %.1f",
                  exchange.small_tokens, exchange.fixed.period * 1e6,
                  exchange.fixed.work_seconds * 1e6, exchange.fixed.exchange_seconds * 1e6);
    quantity("EP lock-step", c.expert_exchange_lockstep * 1e6, 2, "us", method);
    std::snprintf(method, sizeof method,
                  "after a w32 64-row forward: (%.1f us - work %.1f - alone %.1f - lock-step) / "
                  "work",
                  exchange.layer.period * 1e6, exchange.layer.work_seconds * 1e6,
                  exchange.layer.exchange_seconds * 1e6);
    quantity("EP lock-step spread", c.expert_exchange_spread * 100, 2, "%", method);
    // Each hand-off's fit: the fixed cost with the three batches it came from, then the costs per
    // sample and per kB.
    auto handoff_lines = [&](const char* what, const char* calls, const HandoffFit& fit) {
      const HandoffFit::Point* p = fit.points;
      std::snprintf(method, sizeof method,
                    "%s; %d / %d / %d samples, %.1f / %.1f / %.1f kB: %.0f / %.0f / %.0f us", calls,
                    p[0].samples, p[1].samples, p[2].samples, p[0].bytes / 1e3, p[1].bytes / 1e3,
                    p[2].bytes / 1e3, p[0].seconds * 1e6, p[1].seconds * 1e6, p[2].seconds * 1e6);
      quantity(what, fit.cost.overhead * 1e6, 2, "us", method);
      quantity((std::string(what) + " a sample").c_str(), fit.cost.sample_seconds * 1e6, 3, "us",
               "same fit");
      quantity((std::string(what) + " a kB").c_str(), fit.cost.byte_seconds * 1e9, 3, "us",
               "same fit, a kB of packed samples");
    };
    handoff_lines("queue hand-off", "pipeline_rollouts", handoffs.queue);
    handoff_lines("replica allgather", "allgather_rollouts", handoffs.allgather);
  }
  std::printf("# matmul check: %s; wrote %s (reads back)\n", matmul_ok ? "OK" : "WRONG",
              output.c_str());
  return matmul_ok ? 0 : 1;
}

}  // namespace rlf
