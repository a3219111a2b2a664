// Cluster and job files: the shipped ones load; missing, unknown and impossible fields are
// ConfigErrors that name the field; the calibrate writer's text reads back equal.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>

#include "kernels/error.h"
#include "src/sim/cluster.h"
#include "src/sim/rl_job.h"
#include "tests/sim/sim_test_files.h"

namespace rlf::sim {
namespace {

const char* kCluster =
    "[cluster]\nname = test\ndevices_per_node = 8\nnodes_per_supernode = 4\nsupernodes = 2\n"
    "matmul_flops = 1e12\nhalf_rate_rows = 64\nhalf_rate_width = 32\ndecode_flops = 5e11\n"
    "decode_half_rate_rows = 8\ndecode_half_rate_width = 16\nmemory_bytes = 64e9\n"
    "memory_bandwidth = 1e12\nhost_bandwidth = 5e10\n"
    "kernel_overhead = 1e-6\noptimizer_rate = 2e10\nsampler_rate = 1e9\n"
    "sampler_sort_rate = 4e9\nintra_node_bandwidth = 2e11\nintra_node_latency = 1e-6\n"
    "intra_supernode_bandwidth = 1e11\nintra_supernode_latency = 2e-6\n"
    "inter_supernode_bandwidth = 2.5e10\ninter_supernode_latency = 5e-6\n";

std::string replace_line(std::string text, const std::string& key, const std::string& line) {
  const size_t at = text.find(key + " = ");
  const size_t end = text.find('\n', at);
  return text.replace(at, end - at + 1, line);
}

TEST(ClusterConfig, ShippedFileLoads) {
  const ClusterConfig c = load_cluster_config("cloudmatrix-384");
  EXPECT_EQ(c.devices(), 384);
  EXPECT_EQ(c.devices_per_supernode(), 384);
  EXPECT_DOUBLE_EQ(c.memory_bandwidth, 3.2e12);
}

TEST(ClusterConfig, LevelsSpanned) {
  const ClusterConfig c = load_cluster_config(test::write_scratch("levels.ini", kCluster));
  EXPECT_EQ(c.devices(), 64);
  EXPECT_EQ(c.level_spanned(8), LinkLevel::IntraNode);
  EXPECT_EQ(c.level_spanned(9), LinkLevel::IntraSupernode);
  EXPECT_EQ(c.level_spanned(32), LinkLevel::IntraSupernode);
  EXPECT_EQ(c.level_spanned(33), LinkLevel::InterSupernode);
  EXPECT_DOUBLE_EQ(c.link(LinkLevel::InterSupernode).bandwidth, 2.5e10);
  // 1 MB in 2 messages over the inter-supernode link: 1e6 / 2.5e10 + 2 x 5e-6.
  EXPECT_DOUBLE_EQ(c.link(LinkLevel::InterSupernode).seconds(1e6, 2), 4e-5 + 1e-5);
}

TEST(ClusterConfig, MissingFieldIsNamed) {
  const std::string text = replace_line(kCluster, "memory_bandwidth", "");
  EXPECT_NE(test::cluster_error_of(text, "missing.ini").find("cluster.memory_bandwidth"),
            std::string::npos)
      << test::cluster_error_of(text, "missing.ini");
}

// A file written before the optimizer, sampler and width keys existed: the missing key is named
// and the message says how to get a complete file.
TEST(ClusterConfig, OldFileWithoutNewKeysSaysRecalibrate) {
  for (const char* key :
       {"half_rate_width", "decode_flops", "decode_half_rate_rows", "decode_half_rate_width",
        "optimizer_rate", "sampler_rate", "sampler_sort_rate"}) {
    const std::string message =
        test::cluster_error_of(replace_line(kCluster, key, ""), std::string("old_") + key + ".ini");
    EXPECT_NE(message.find(std::string("cluster.") + key), std::string::npos) << message;
    EXPECT_NE(message.find("rlfusion bench calibrate"), std::string::npos) << message;
  }
}

TEST(ClusterConfig, ImpossibleFieldsAreNamed) {
  for (const auto& [key, bad] :
       std::vector<std::pair<std::string, std::string>>{{"devices_per_node", "0"},
                                                        {"supernodes", "-1"},
                                                        {"matmul_flops", "0"},
                                                        {"half_rate_rows", "-1"},
                                                        {"half_rate_width", "-1"},
                                                        {"decode_flops", "0"},
                                                        {"decode_half_rate_rows", "-1"},
                                                        {"decode_half_rate_width", "-1"},
                                                        {"optimizer_rate", "0"},
                                                        {"sampler_rate", "-2"},
                                                        {"sampler_sort_rate", "0"},
                                                        {"intra_node_bandwidth", "-5"},
                                                        {"inter_supernode_latency", "-1e-6"},
                                                        {"kernel_overhead", "-1"}}) {
    const std::string message = test::cluster_error_of(
        replace_line(kCluster, key, key + " = " + bad + "\n"), "bad_" + key + ".ini");
    EXPECT_NE(message.find("cluster." + key), std::string::npos) << key << ": " << message;
  }
}

// The EP exchange's software cost and its lock-step cost are optional (0: the link time alone),
// written back when set, never negative, and a malformed value names its key.
TEST(ClusterConfig, ExpertExchangeKeysAreOptional) {
  ClusterConfig c = load_cluster_config(test::write_scratch("no_exchange.ini", kCluster));
  EXPECT_EQ(c.expert_exchange_seconds(100), 0);
  EXPECT_EQ(c.expert_exchange_lockstep, 0);
  EXPECT_EQ(c.expert_exchange_spread, 0);
  c.expert_exchange_overhead = 3e-6;
  c.expert_exchange_row_seconds = 2e-8;
  c.expert_exchange_lockstep = 4e-6;
  c.expert_exchange_spread = 0.125;
  const ClusterConfig back =
      load_cluster_config(test::write_scratch("exchange.ini", cluster_config_ini(c, "")));
  EXPECT_DOUBLE_EQ(back.expert_exchange_overhead, 3e-6);
  EXPECT_DOUBLE_EQ(back.expert_exchange_row_seconds, 2e-8);
  EXPECT_DOUBLE_EQ(back.expert_exchange_lockstep, 4e-6);
  EXPECT_DOUBLE_EQ(back.expert_exchange_spread, 0.125);
  EXPECT_DOUBLE_EQ(back.expert_exchange_seconds(100), 3e-6 + 100 * 2e-8);
  // A file without the backward keys charges the backward as the forward; with them, their own.
  EXPECT_DOUBLE_EQ(
      load_cluster_config(
          test::write_scratch("forward_only.ini", std::string(kCluster) +
                                                      "expert_exchange_overhead = 3e-6\n"
                                                      "expert_exchange_row_seconds = 2e-8\n"))
          .expert_backward_seconds(100),
      3e-6 + 100 * 2e-8);
  c.expert_backward_overhead = 5e-6;
  c.expert_backward_row_seconds = 1e-8;
  const ClusterConfig both =
      load_cluster_config(test::write_scratch("backward.ini", cluster_config_ini(c, "")));
  EXPECT_DOUBLE_EQ(both.expert_backward_seconds(100), 5e-6 + 100 * 1e-8);
  EXPECT_DOUBLE_EQ(both.expert_exchange_seconds(100), 3e-6 + 100 * 2e-8);
  // The replica hand-offs' three costs each likewise (optional: 0 without them).
  EXPECT_EQ(both.queue_handoff.seconds(100, 1e4), 0);
  EXPECT_EQ(both.replica_allgather.seconds(100, 1e4), 0);
  c.queue_handoff = {5e-5, 1e-6, 2e-9};
  c.replica_allgather = {3e-5, 4e-7, 1e-9};
  const ClusterConfig handoffs =
      load_cluster_config(test::write_scratch("handoff.ini", cluster_config_ini(c, "")));
  EXPECT_DOUBLE_EQ(handoffs.queue_handoff.seconds(100, 1e4), 5e-5 + 100 * 1e-6 + 1e4 * 2e-9);
  EXPECT_DOUBLE_EQ(handoffs.replica_allgather.seconds(100, 1e4), 3e-5 + 100 * 4e-7 + 1e4 * 1e-9);
  for (const std::string key :
       {"expert_exchange_overhead", "expert_exchange_row_seconds", "expert_exchange_lockstep",
        "expert_exchange_spread", "expert_backward_overhead", "expert_backward_row_seconds",
        "queue_handoff_overhead", "queue_handoff_sample_seconds", "queue_handoff_byte_seconds",
        "replica_allgather_overhead", "replica_allgather_sample_seconds",
        "replica_allgather_byte_seconds"}) {
    const std::string message =
        test::cluster_error_of(std::string(kCluster) + key + " = -1e-6\n", "bad_" + key + ".ini");
    EXPECT_NE(message.find("cluster." + key), std::string::npos) << key << ": " << message;
  }
  const std::string malformed = test::cluster_error_of(
      std::string(kCluster) + "expert_exchange_lockstep = soon\n", "malformed_lockstep.ini");
  EXPECT_NE(malformed.find("expert_exchange_lockstep"), std::string::npos) << malformed;
}

// The rows' work beyond their FLOPs (row_seconds): optional (0 without it, the files of before it
// and the shipped ones), read back as written, never negative.
TEST(ClusterConfig, RowWorkIsOptionalAndReadsBack) {
  ClusterConfig c = load_cluster_config(test::write_scratch("no_rows.ini", kCluster));
  EXPECT_EQ(c.row_seconds, 0);
  EXPECT_EQ(load_cluster_config("cloudmatrix-384").row_seconds, 0);
  c.row_seconds = 1.5e-6;
  EXPECT_DOUBLE_EQ(
      load_cluster_config(test::write_scratch("rows.ini", cluster_config_ini(c, ""))).row_seconds,
      1.5e-6);
  const std::string negative =
      test::cluster_error_of(std::string(kCluster) + "row_seconds = -1e-6\n", "bad_rows.ini");
  EXPECT_NE(negative.find("cluster.row_seconds"), std::string::npos) << negative;
  const std::string malformed =
      test::cluster_error_of(std::string(kCluster) + "row_seconds = a few\n", "word_rows.ini");
  EXPECT_NE(malformed.find("row_seconds"), std::string::npos) << malformed;
}

// A forward's share of the row work (forward_row_seconds): optional (a third of row_seconds
// without it, the files of before it and the shipped ones), read back as written, within
// [0, row_seconds].
TEST(ClusterConfig, ForwardRowWorkIsOptionalBoundedAndReadsBack) {
  ClusterConfig c = load_cluster_config(test::write_scratch("no_forward_rows.ini", kCluster));
  EXPECT_FALSE(c.forward_row_seconds.has_value());
  c.row_seconds = 1.5e-6;
  EXPECT_DOUBLE_EQ(c.forward_row_work(), 0.5e-6);
  EXPECT_FALSE(load_cluster_config("cloudmatrix-384").forward_row_seconds.has_value());
  c.forward_row_seconds = 0.75e-6;
  EXPECT_DOUBLE_EQ(c.forward_row_work(), 0.75e-6);
  const ClusterConfig back =
      load_cluster_config(test::write_scratch("forward_rows.ini", cluster_config_ini(c, "")));
  ASSERT_TRUE(back.forward_row_seconds.has_value());
  EXPECT_DOUBLE_EQ(*back.forward_row_seconds, 0.75e-6);
  EXPECT_DOUBLE_EQ(back.forward_row_work(), 0.75e-6);
  const std::string rows = std::string(kCluster) + "row_seconds = 1e-6\n";
  const std::string negative =
      test::cluster_error_of(rows + "forward_row_seconds = -1e-7\n", "bad_forward_rows.ini");
  EXPECT_NE(negative.find("cluster.forward_row_seconds"), std::string::npos) << negative;
  const std::string above =
      test::cluster_error_of(rows + "forward_row_seconds = 2e-6\n", "above_forward_rows.ini");
  EXPECT_NE(above.find("cluster.forward_row_seconds must be at most row_seconds"),
            std::string::npos)
      << above;
  const std::string malformed =
      test::cluster_error_of(rows + "forward_row_seconds = quick\n", "word_forward_rows.ini");
  EXPECT_NE(malformed.find("forward_row_seconds"), std::string::npos) << malformed;
}

// The touched experts' cost: optional (both keys or neither), read back, interpolated in
// log(bytes) between its points and held at the ends; bad lists name the key.
TEST(ClusterConfig, TouchedExpertCostIsOptionalInterpolatedAndReadsBack) {
  ClusterConfig c = load_cluster_config(test::write_scratch("no_touched.ini", kCluster));
  EXPECT_TRUE(c.active_expert_bytes.empty());
  EXPECT_EQ(c.active_expert_call_seconds(1e6), 0);
  EXPECT_TRUE(load_cluster_config("cloudmatrix-384").active_expert_bytes.empty());
  c.active_expert_bytes = {1e4, 1e6};
  c.active_expert_seconds = {1e-6, 5e-6};
  const ClusterConfig back =
      load_cluster_config(test::write_scratch("touched.ini", cluster_config_ini(c, "")));
  ASSERT_EQ(back.active_expert_bytes.size(), 2u);
  EXPECT_DOUBLE_EQ(back.active_expert_bytes[1], 1e6);
  EXPECT_DOUBLE_EQ(back.active_expert_seconds[1], 5e-6);
  EXPECT_DOUBLE_EQ(back.active_expert_call_seconds(1e5), 3e-6);  // halfway in log(bytes)
  EXPECT_DOUBLE_EQ(back.active_expert_call_seconds(1e3), 1e-6);  // held at the ends
  EXPECT_DOUBLE_EQ(back.active_expert_call_seconds(1e8), 5e-6);
  EXPECT_EQ(back.active_expert_call_seconds(0), 0);
  for (const auto& [lines, key] :
       {std::pair{"active_expert_bytes = 1e4 1e6\n", "both or neither"},
        {"active_expert_bytes = 1e4 1e6\nactive_expert_seconds = 1e-6\n", "as many values"},
        {"active_expert_bytes = 1e6 1e4\nactive_expert_seconds = 1e-6 2e-6\n", "ascending"},
        {"active_expert_bytes = 1e4 1e6\nactive_expert_seconds = 1e-6 -2e-6\n",
         "active_expert_seconds must be >= 0"},
        {"active_expert_bytes = 1e4 lots\nactive_expert_seconds = 1e-6 2e-6\n",
         "active_expert_bytes"}}) {
    const std::string error =
        test::cluster_error_of(std::string(kCluster) + lines, "bad_touched.ini");
    EXPECT_NE(error.find(key), std::string::npos) << lines << error;
  }
}

// The sampler's measured seconds a row by vocabulary: optional (both keys or neither; without them
// the fit), read back, interpolated in log V and log seconds between its points, and scaled by
// the fit past its ends; bad lists name the key.
TEST(ClusterConfig, SamplerTableIsOptionalInterpolatedAndReadsBack) {
  ClusterConfig c = load_cluster_config(test::write_scratch("no_sampler_table.ini", kCluster));
  EXPECT_TRUE(c.sampler_vocab.empty());
  EXPECT_DOUBLE_EQ(c.sampler_seconds(64), c.sampler_fit_seconds(64));
  EXPECT_TRUE(load_cluster_config("cloudmatrix-384").sampler_vocab.empty());
  c.sampler_vocab = {16, 64};
  c.sampler_row_seconds = {1e-7, 4e-7};
  const ClusterConfig back =
      load_cluster_config(test::write_scratch("sampler_table.ini", cluster_config_ini(c, "")));
  ASSERT_EQ(back.sampler_vocab.size(), 2u);
  EXPECT_DOUBLE_EQ(back.sampler_vocab[1], 64);
  EXPECT_DOUBLE_EQ(back.sampler_row_seconds[1], 4e-7);
  EXPECT_DOUBLE_EQ(back.sampler_seconds(16), 1e-7);
  EXPECT_NEAR(back.sampler_seconds(32), 2e-7, 1e-20);  // halfway in log V: the geometric mean
  // Past the ends: the nearest point times the fit's growth.
  EXPECT_NEAR(back.sampler_seconds(4096),
              4e-7 * back.sampler_fit_seconds(4096) / back.sampler_fit_seconds(64), 1e-18);
  EXPECT_NEAR(back.sampler_seconds(8),
              1e-7 * back.sampler_fit_seconds(8) / back.sampler_fit_seconds(16), 1e-20);
  for (const auto& [lines, key] :
       {std::pair{"sampler_vocab = 16 64\n", "both or neither"},
        {"sampler_vocab = 16 64\nsampler_row_seconds = 1e-7\n", "as many values"},
        {"sampler_vocab = 64 16\nsampler_row_seconds = 1e-7 2e-7\n", "ascending"},
        {"sampler_vocab = 16 64\nsampler_row_seconds = 1e-7 0\n",
         "sampler_row_seconds must be a positive"},
        {"sampler_vocab = 16 many\nsampler_row_seconds = 1e-7 2e-7\n", "sampler_vocab"}}) {
    const std::string error =
        test::cluster_error_of(std::string(kCluster) + lines, "bad_sampler_table.ini");
    EXPECT_NE(error.find(key), std::string::npos) << lines << error;
  }
}

TEST(ClusterConfig, OptimizerCurveIsOptionalInterpolatedAndReadsBack) {
  ClusterConfig c = load_cluster_config(test::write_scratch("no_optimizer_curve.ini", kCluster));
  EXPECT_TRUE(c.optimizer_parameters.empty());
  EXPECT_DOUBLE_EQ(c.optimizer_seconds(4e6), 4e6 / 2e10);  // the rate at every count
  EXPECT_TRUE(load_cluster_config("cloudmatrix-384").optimizer_parameters.empty());
  c.optimizer_parameters = {1e5, 1e7};
  c.optimizer_parameter_seconds = {1e-9, 4e-9};
  const ClusterConfig back =
      load_cluster_config(test::write_scratch("optimizer_curve.ini", cluster_config_ini(c, "")));
  ASSERT_EQ(back.optimizer_parameters.size(), 2u);
  EXPECT_DOUBLE_EQ(back.optimizer_parameter_seconds[1], 4e-9);
  EXPECT_NEAR(back.optimizer_seconds(1e6), 1e6 * 2e-9, 1e-15);  // halfway in log: 2 ns each
  EXPECT_NEAR(back.optimizer_seconds(1e4), 1e4 * 1e-9, 1e-18);  // below the ends: held
  EXPECT_NEAR(back.optimizer_seconds(1e9), 1e9 * 4e-9, 1e-12);  // above
  EXPECT_DOUBLE_EQ(back.optimizer_seconds(0), 0);
  for (const auto& [lines, key] :
       {std::pair{"optimizer_parameter_seconds = 1e-9\n", "both or neither"},
        {"optimizer_parameters = 1e5 1e7\noptimizer_parameter_seconds = 1e-9\n", "as many values"},
        {"optimizer_parameters = 1e7 1e5\noptimizer_parameter_seconds = 1e-9 2e-9\n", "ascending"},
        {"optimizer_parameters = 1e5 1e7\noptimizer_parameter_seconds = 1e-9 0\n",
         "optimizer_parameter_seconds must be a positive"},
        {"optimizer_parameters = 0 1e7\noptimizer_parameter_seconds = 1e-9 2e-9\n",
         "optimizer_parameters must be a positive"}}) {
    const std::string error =
        test::cluster_error_of(std::string(kCluster) + lines, "bad_optimizer_curve.ini");
    EXPECT_NE(error.find(key), std::string::npos) << lines << error;
  }
}

TEST(ClusterConfig, UnknownKeyAndMalformedValueAreErrors) {
  EXPECT_NE(
      test::cluster_error_of(std::string(kCluster) + "nvlink = 1\n", "unknown.ini").find("nvlink"),
      std::string::npos);
  EXPECT_NE(test::cluster_error_of(replace_line(kCluster, "memory_bytes", "memory_bytes = lots\n"),
                                   "malformed.ini")
                .find("memory_bytes"),
            std::string::npos);
  EXPECT_THROW(load_cluster_config("no-such-cluster"), ConfigError);
}

TEST(ClusterConfig, WrittenTextReadsBackEqual) {
  const ClusterConfig c = load_cluster_config(test::write_scratch("orig.ini", kCluster));
  const ClusterConfig back = load_cluster_config(
      test::write_scratch("back.ini", cluster_config_ini(c, "two\nlines of comment")));
  EXPECT_EQ(back.name, "test");
  EXPECT_EQ(back.devices(), c.devices());
  EXPECT_DOUBLE_EQ(back.host_bandwidth, c.host_bandwidth);
  EXPECT_DOUBLE_EQ(back.kernel_overhead, c.kernel_overhead);
  EXPECT_DOUBLE_EQ(back.half_rate_rows, 64);
  EXPECT_DOUBLE_EQ(back.half_rate_width, 32);
  EXPECT_DOUBLE_EQ(back.optimizer_rate, 2e10);
  EXPECT_DOUBLE_EQ(back.sampler_rate, 1e9);
  EXPECT_DOUBLE_EQ(back.sampler_sort_rate, 4e9);
  // Hockney in rows and width: 1 / rate = (1 + 64 / rows + 32 / width) / peak. Half the peak
  // at the half-rate rows with no width loss, a third of it with the width at its half size too.
  EXPECT_DOUBLE_EQ(back.compute_rate(64, 1e300), 0.5e12);
  EXPECT_DOUBLE_EQ(back.compute_rate(64, 32), 1e12 / 3);
  EXPECT_DOUBLE_EQ(back.compute_rate(128, 64), 1e12 / 2);
  // Generation's own law: 1 / rate = (1 + 8 / rows + 16 / width) / 5e11.
  EXPECT_DOUBLE_EQ(back.decode_rate(8, 16), 5e11 / 3);
  EXPECT_DOUBLE_EQ(back.decode_rate(16, 1e300), 5e11 / 1.5);
  // The sampler: V / 1e9 + V log2 V / 4e9 a row.
  EXPECT_DOUBLE_EQ(back.sampler_seconds(1024), 1024 / 1e9 + 1024 * 10 / 4e9);
  EXPECT_DOUBLE_EQ(back.intra_supernode.latency, c.intra_supernode.latency);
  EXPECT_DOUBLE_EQ(back.inter_supernode.bandwidth, c.inter_supernode.bandwidth);
}

const char* kJob =
    "[job]\nprompts = 4\ngroup_size = 2\nmicro_batch = 2\nprompt_distribution = fixed\n"
    "prompt_length = 10\nresponse_distribution = uniform\nresponse_min = 10\nresponse_max = 30\n"
    "finish_threshold = 0.5\n";

TEST(RlJob, UniformLengthsByHand) {
  const RlJob job = load_rl_job(test::write_scratch("job.ini", kJob));
  EXPECT_EQ(job.samples(), 8);
  EXPECT_DOUBLE_EQ(job.prompt.mean, 10);
  EXPECT_DOUBLE_EQ(job.response.mean, 20);
  // Expected longest of 8 uniform draws on [10, 30]: 10 + 20 x 8 / 9; the median cut: 20.
  EXPECT_DOUBLE_EQ(job.response.step_longest, 10 + 20.0 * 8 / 9);
  EXPECT_DOUBLE_EQ(job.response.cut, 20);
  EXPECT_DOUBLE_EQ(job.tokens_per_step(), 8 * 30);
  // The lengths 10..30 equally likely: variance (21^2 - 1) / 12; a fixed length does not spread.
  EXPECT_DOUBLE_EQ(job.response.deviation, std::sqrt(440.0 / 12));
  EXPECT_DOUBLE_EQ(job.prompt.deviation, 0);
}

// A fused rank's peak is its worst generation phase's prefill: the largest of `phases` phase means
// of `draws` prompts each.
TEST(RlJob, ExpectedWorstPhaseMeanByHand) {
  const LengthSummary prompts{5.95, 8, 7.5, 1.44};
  // One phase: the mean; no spread: the mean.
  EXPECT_DOUBLE_EQ(expected_worst_phase_mean(prompts, 1, 8), 5.95);
  EXPECT_DOUBLE_EQ(expected_worst_phase_mean(LengthSummary{6, 6, 6, 0}, 60, 8), 6);
  // Two phases: E[max of two standard normals] = 1 / sqrt(pi); a phase mean of 8 draws spreads by
  // deviation / sqrt(8).
  EXPECT_NEAR(expected_worst_phase_mean(prompts, 2, 8),
              5.95 + 1.44 / std::sqrt(8.0) / std::sqrt(M_PI), 1e-6);
  // 60 phases: E[max of 60 standard normals] = 2.3190 (tables of normal order statistics).
  EXPECT_NEAR(expected_worst_phase_mean(prompts, 60, 8), 5.95 + 2.3190 * 1.44 / std::sqrt(8.0),
              1e-3);
  // More phases reach further; more prompts per phase average the spread out.
  EXPECT_GT(expected_worst_phase_mean(prompts, 61, 8), expected_worst_phase_mean(prompts, 60, 8));
  EXPECT_LT(expected_worst_phase_mean(prompts, 60, 9), expected_worst_phase_mean(prompts, 60, 8));
}

TEST(RlJob, LognormalAndTaskLengths) {
  const RlJob pangu = load_rl_job("pangu-rl");
  // Capped lognormal: mean above the median (long tail), the step's longest at the cap.
  EXPECT_GT(pangu.response.mean, 2048);
  EXPECT_LT(pangu.response.mean, 7168);
  EXPECT_DOUBLE_EQ(pangu.response.step_longest, 7168);
  EXPECT_GT(pangu.response.cut, 2048);
  const RlJob sort = load_rl_job("tiny-sort");
  // sort: lists of 2..6 digits: prompt = digits + '>' + <bos>, answer = digits + <eos>.
  EXPECT_NEAR(sort.response.mean, 5, 0.1);
  EXPECT_NEAR(sort.prompt.mean, 6, 0.1);
  EXPECT_DOUBLE_EQ(sort.response.step_longest, 7);
  // 2..6 digits equally likely: variance 2, measured over the task's samples.
  EXPECT_NEAR(sort.response.deviation, std::sqrt(2.0), 0.05);
  EXPECT_NEAR(sort.prompt.deviation, std::sqrt(2.0), 0.05);
  EXPECT_GT(pangu.response.deviation, 0);
}

TEST(RlJob, BadFieldsAreNamed) {
  auto message = [](const std::string& text, const std::string& name) -> std::string {
    try {
      load_rl_job(test::write_scratch(name, text));
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message("[job]\ngroup_size = 2\nprompt_distribution = fixed\nprompt_length = 1\n"
                    "response_distribution = fixed\nresponse_length = 1\n",
                    "no_prompts.ini")
                .find("job.prompts"),
            std::string::npos);
  std::string text = kJob;
  EXPECT_NE(message(text.replace(text.find("micro_batch = 2"), 15, "micro_batch = 3"), "micro.ini")
                .find("job.micro_batch"),
            std::string::npos);
  text = kJob;
  EXPECT_NE(
      message(text.replace(text.find("response_min = 10"), 17, "response_min = 40"), "minmax.ini")
          .find("job.response_"),
      std::string::npos);
  text = kJob;
  EXPECT_NE(message(text.replace(text.find("uniform"), 7, "zipf"), "dist.ini")
                .find("job.response_distribution"),
            std::string::npos);
}

// The router's concentration: 1 (uniform) unless the file says; below 1 is refused when read, above
// the model's experts / top_k when checked against the model.
TEST(RlJob, RouterConcentrationIsReadAndBounded) {
  EXPECT_DOUBLE_EQ(load_rl_job(test::write_scratch("uniform.ini", kJob)).router_max_over_mean, 1);
  const RlJob skewed = load_rl_job(
      test::write_scratch("skewed.ini", std::string(kJob) + "router_max_over_mean = 4.5\n"));
  EXPECT_DOUBLE_EQ(skewed.router_max_over_mean, 4.5);
  EXPECT_NO_THROW(check_router_concentration(skewed, 16, 2, "here"));  // at most 8
  std::string message;
  try {
    check_router_concentration(skewed, 8, 2, "here");  // at most 4
  } catch (const ConfigError& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("job.router_max_over_mean"), std::string::npos) << message;
  EXPECT_NE(message.find("8 / 2"), std::string::npos) << message;
  message.clear();
  try {
    load_rl_job(
        test::write_scratch("below.ini", std::string(kJob) + "router_max_over_mean = 0.5\n"));
  } catch (const ConfigError& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("job.router_max_over_mean must be >= 1"), std::string::npos) << message;
}

// The experts a training call touches: 0 (a uniform router's) unless the file says; below 0 is
// refused when read, above the model's experts when checked against the model.
TEST(RlJob, TouchedExpertsAreReadAndBounded) {
  EXPECT_EQ(load_rl_job(test::write_scratch("touched0.ini", kJob)).active_experts, 0);
  const RlJob measured = load_rl_job(
      test::write_scratch("touched.ini", std::string(kJob) + "active_experts = 6.36\n"));
  EXPECT_DOUBLE_EQ(measured.active_experts, 6.36);
  EXPECT_NO_THROW(check_router_concentration(measured, 16, 2, "here"));
  std::string message;
  try {
    check_router_concentration(measured, 4, 2, "here");
  } catch (const ConfigError& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("job.active_experts = 6.36"), std::string::npos) << message;
  EXPECT_NE(message.find("experts = 4"), std::string::npos) << message;
  message.clear();
  try {
    load_rl_job(
        test::write_scratch("touched_negative.ini", std::string(kJob) + "active_experts = -1\n"));
  } catch (const ConfigError& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("job.active_experts must be >= 0"), std::string::npos) << message;
}

TEST(RlJob, MeasuredMeanAndLongest) {
  // Mean 5 with longest 7: uniform on [3, 7]; the 0.9 cut at 3 + 4 x 0.9.
  const LengthSummary s = summarize_mean_longest(5, 7, 0.9);
  EXPECT_DOUBLE_EQ(s.step_longest, 7);
  EXPECT_DOUBLE_EQ(s.cut, 3 + 4 * 0.9);
  EXPECT_DOUBLE_EQ(summarize_mean_longest(5, 5, 0.9).step_longest, 5);
  // The integers 3..7 equally likely: variance (5^2 - 1) / 12 = 2.
  EXPECT_DOUBLE_EQ(s.deviation, std::sqrt(2.0));
  EXPECT_DOUBLE_EQ(summarize_mean_longest(5, 5, 0.9).deviation, 0);
}

}  // namespace
}  // namespace rlf::sim
