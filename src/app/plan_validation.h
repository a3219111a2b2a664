// `rlfusion plan --validate CSV`: predicted vs measured step time, link bytes and device-memory
// peaks for runs this machine made (jobs/local/validate_planner.sh writes the CSV).
#pragma once

#include <string>

namespace rlf {

namespace sim {
struct Prediction;
}

// The step's parts as a JSON object, {"generation":seconds,...} (sim::step_parts' names and order):
// `plan --json` for one strategy and each case of `plan --validate --json`.
void print_step_parts_json(const sim::Prediction& p);

// Prints the table and its verdict lines; returns 0 (a target missed is a finding, not an error).
// Each case is predicted on the cluster file its `cluster` column names (written by `bench
// calibrate` for that case's link emulation). A malformed CSV is a ConfigError naming the line and
// column.
int run_plan_validation(const std::string& csv_path, bool json);

}  // namespace rlf
