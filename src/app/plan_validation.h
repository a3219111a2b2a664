// `rlfusion plan --validate CSV`: predicted vs measured step time, link bytes and device-memory
// peaks for runs this machine made (jobs/local/validate_planner.sh writes the CSV).
#pragma once

#include <string>

namespace rlf {

// Prints the table and its verdict lines; returns 0 (a target missed is a finding, not an error).
// Each case is predicted on the cluster file its `cluster` column names (written by `bench
// calibrate` for that case's link emulation). A malformed CSV is a ConfigError naming the line and
// column.
int run_plan_validation(const std::string& csv_path, bool json);

}  // namespace rlf
