// Compute rates measured on a grid of call shapes (rows a kernel call processes x the model's
// matrix width), as `bench calibrate` measures them. Inside the grid a rate is interpolated from
// its measured neighbours; outside it the nearest grid point's rate is carried along by a smooth
// law (the cluster's Hockney fit). A fit with three parameters cannot follow everything the
// measured points show (a decode step of one row, where per-call costs dominate, or the step
// from narrow to wide matrices); the measured points themselves can.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace rlf::sim {

struct RateTable {
  std::vector<double> rows;    // ascending, > 0
  std::vector<double> widths;  // ascending, > 0 (ModelShape::width of the measured models)
  std::vector<double> rates;   // FLOP/s, widths.size() x rows.size(), width-major

  bool empty() const { return rates.empty(); }
  // The point (rows, width) moved inside the grid (each coordinate clamped to its range).
  double clamp_rows(double r) const;
  double clamp_width(double w) const;
  // Bilinear interpolation in (log rows, log width) of log rate, at a point inside the grid
  // (clamped first). Returns each measured rate exactly at its grid point.
  double at(double rows, double width) const;
  // Throws ConfigError naming `source` and `key` when the grid is malformed (sizes, order, signs).
  void validate(const std::string& source, const std::string& key) const;
};

// Where x (clamped to the axis' range) falls on an ascending axis, in log space: the index i of
// the lower of its two neighbours and its weight t towards the upper, log(x / axis[i]) /
// log(axis[i + 1] / axis[i]) (i = 0, t = 0 on a one-point axis).
void log_bracket(const std::vector<double>& axis, double x, size_t& i, double& t);

// "a b c" <-> a list of numbers (the cluster file's form of a table's axes and rates).
std::vector<double> parse_number_list(const std::string& text, const std::string& what);
std::string number_list(const std::vector<double>& values);

}  // namespace rlf::sim
