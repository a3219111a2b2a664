// The measured rate grid of a calibrated cluster: exact at its points, log-linear between them,
// the Hockney law's shape outside; malformed grids are ConfigErrors naming the key; a cluster
// file's grid reads back equal.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <random>
#include <string>
#include <utility>

#include "kernels/error.h"
#include "src/sim/cluster.h"
#include "src/sim/rate_table.h"
#include "tests/sim/sim_test_files.h"

namespace rlf::sim {
namespace {

RateTable random_table(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> rate(1e9, 5e10);
  RateTable t;
  t.rows = {1, 8, 64, 256};
  t.widths = {31, 122, 241};
  for (size_t k = 0; k < t.rows.size() * t.widths.size(); ++k) t.rates.push_back(rate(rng));
  return t;
}

TEST(RateTable, ExactAtEveryMeasuredPoint) {
  std::mt19937_64 rng(11);
  const RateTable t = random_table(rng);
  for (size_t j = 0; j < t.widths.size(); ++j)
    for (size_t i = 0; i < t.rows.size(); ++i)
      EXPECT_NEAR(t.at(t.rows[i], t.widths[j]), t.rates[j * t.rows.size() + i],
                  1e-12 * t.rates[j * t.rows.size() + i]);
}

TEST(RateTable, GeometricMeanHalfwayInLogSpaceAndBoundedBetween) {
  std::mt19937_64 rng(12);
  const RateTable t = random_table(rng);
  const size_t n = t.rows.size();
  // Halfway between two rows (in log rows) on a measured width: the geometric mean.
  const double r = std::sqrt(t.rows[1] * t.rows[2]);
  EXPECT_NEAR(t.at(r, t.widths[0]), std::sqrt(t.rates[1] * t.rates[2]), 1e-9 * t.rates[1]);
  // Anywhere inside a cell: between the cell's smallest and largest corner.
  std::uniform_real_distribution<double> u(0, 1);
  for (int k = 0; k < 200; ++k) {
    const double rows = t.rows[1] * std::pow(t.rows[2] / t.rows[1], u(rng));
    const double width = t.widths[1] * std::pow(t.widths[2] / t.widths[1], u(rng));
    const double corners[] = {t.rates[n + 1], t.rates[n + 2], t.rates[2 * n + 1],
                              t.rates[2 * n + 2]};
    const double v = t.at(rows, width);
    EXPECT_GE(v, *std::min_element(std::begin(corners), std::end(corners)) * (1 - 1e-12));
    EXPECT_LE(v, *std::max_element(std::begin(corners), std::end(corners)) * (1 + 1e-12));
  }
}

// Outside the grid the nearest point's rate, carried by the law: a cluster's rate at rows 4x past
// the grid equals the edge point's measured rate times the law's ratio between the two shapes.
TEST(RateTable, ClusterExtendsTheGridByItsLaw) {
  std::mt19937_64 rng(13);
  ClusterConfig c;
  c.matmul_flops = 4e10;
  c.half_rate_rows = 50;
  c.half_rate_width = 60;
  c.layer_table = random_table(rng);
  const RateTable& t = c.layer_table;
  auto law = [&](double r, double w) {
    return ClusterConfig::hockney(r, w, c.matmul_flops, c.half_rate_rows, c.half_rate_width);
  };
  const double edge = t.rates[2 * t.rows.size() + 3];  // widest, most rows
  EXPECT_NEAR(c.compute_rate(1024, 500), edge * law(1024, 500) / law(256, 241), 1e-6 * edge);
  EXPECT_NEAR(c.compute_rate(0.5, 10), t.rates[0] * law(0.5, 10) / law(1, 31), 1e-6 * edge);
  // Inside: the measurement itself, whatever the law says.
  EXPECT_NEAR(c.compute_rate(8, 122), t.rates[t.rows.size() + 1], 1e-6 * edge);
  // No table: the law alone (the decode table is empty here).
  c.decode_flops = 2e10;
  c.decode_half_rate_rows = 4;
  EXPECT_DOUBLE_EQ(c.decode_rate(4, 1e300), 1e10);
}

const char* kBase =
    "[cluster]\nname = grid\ndevices_per_node = 2\nnodes_per_supernode = 1\nsupernodes = 1\n"
    "matmul_flops = 4e10\nhalf_rate_rows = 50\nhalf_rate_width = 60\ndecode_flops = 3e10\n"
    "decode_half_rate_rows = 6\ndecode_half_rate_width = 140\nmemory_bytes = 4e9\n"
    "memory_bandwidth = 1.7e10\nhost_bandwidth = 1.7e10\n"
    "kernel_overhead = 1e-7\noptimizer_rate = 1.2e8\nsampler_rate = 1e300\n"
    "sampler_sort_rate = 1.5e8\nintra_node_bandwidth = 6e9\nintra_node_latency = 3e-5\n"
    "intra_supernode_bandwidth = 6e9\nintra_supernode_latency = 3e-5\n"
    "inter_supernode_bandwidth = 6e9\ninter_supernode_latency = 3e-5\n";

TEST(RateTable, ClusterFileGridReadsBackEqual) {
  const std::string text = std::string(kBase) +
                           "layer_rate_rows = 16 64\nlayer_rate_widths = 31 122.5\n"
                           "layer_rates = 1e10 2e10 1.5e10 3e10\n"
                           "decode_rate_rows = 1 8 64\ndecode_rate_widths = 31\n"
                           "decode_rates = 2e9 7e9 1.3e10\n";
  const ClusterConfig c = load_cluster_config(test::write_scratch("grid.ini", text));
  ASSERT_EQ(c.layer_table.rates.size(), 4u);
  EXPECT_DOUBLE_EQ(c.layer_table.widths[1], 122.5);
  EXPECT_NEAR(c.compute_rate(64, 122.5), 3e10, 1e-12 * 3e10);
  EXPECT_NEAR(c.decode_rate(8, 31), 7e9, 1e-12 * 7e9);
  const ClusterConfig back =
      load_cluster_config(test::write_scratch("grid_back.ini", cluster_config_ini(c, "back")));
  EXPECT_EQ(back.layer_table.rows, c.layer_table.rows);
  EXPECT_EQ(back.layer_table.widths, c.layer_table.widths);
  EXPECT_EQ(back.layer_table.rates, c.layer_table.rates);
  EXPECT_EQ(back.decode_table.rates, c.decode_table.rates);
}

TEST(RateTable, MalformedGridsAreNamed) {
  const std::string base(kBase);
  const std::pair<std::string, std::string> bad[] = {
      {"layer_rate_rows = 16 64\nlayer_rate_widths = 31\n", "all three or none"},
      {"layer_rate_rows = 64 16\nlayer_rate_widths = 31\nlayer_rates = 1 2\n",
       "layer_rate_rows must be strictly ascending"},
      {"layer_rate_rows = 16 64\nlayer_rate_widths = 31\nlayer_rates = 1\n",
       "layer_rates must hold widths x rows = 2 values, got 1"},
      {"decode_rate_rows = 1 8\ndecode_rate_widths = -3\ndecode_rates = 1 2\n",
       "decode_rate_widths must be positive"},
      {"decode_rate_rows = 1 eight\ndecode_rate_widths = 3\ndecode_rates = 1 2\n",
       "'eight' is not a number"},
      {"layer_rate_rows = 16\nlayer_rate_widths = 31\nlayer_rates = 0\n",
       "layer_rates must be positive"},
  };
  for (const auto& [lines, expected] : bad) {
    const std::string message = test::cluster_error_of(base + lines, "bad_grid.ini");
    EXPECT_NE(message.find(expected), std::string::npos) << lines << " -> " << message;
  }
}

}  // namespace
}  // namespace rlf::sim
