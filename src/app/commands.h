// The rlfusion commands. Each takes the words after its name and returns the process exit code;
// bad input throws ConfigError (exit code 2, handled by main).
#pragma once

#include <string>
#include <vector>

namespace rlf {

int run_sft_command(const std::vector<std::string>& args);
int run_train_command(const std::vector<std::string>& args);
int run_eval_command(const std::vector<std::string>& args);
int run_bench_kernels_command(const std::vector<std::string>& args);
int run_bench_queue_command(const std::vector<std::string>& args);
int run_bench_a2a_command(const std::vector<std::string>& args);
int run_bench_allreduce_command(const std::vector<std::string>& args);
int run_bench_modes_command(const std::vector<std::string>& args);
int run_bench_overlap_command(const std::vector<std::string>& args);
int run_bench_checkpoint_command(const std::vector<std::string>& args);
int run_bench_balance_command(const std::vector<std::string>& args);
int run_bench_migration_command(const std::vector<std::string>& args);
int run_bench_rebalance_command(const std::vector<std::string>& args);
int run_bench_reorder_command(const std::vector<std::string>& args);
int run_bench_pipeline_command(const std::vector<std::string>& args);
int run_report_command(const std::vector<std::string>& args);
int run_plan_command(const std::vector<std::string>& args);
int run_bench_calibrate_command(const std::vector<std::string>& args);

}  // namespace rlf
