#include "src/sim/rate_table.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "kernels/error.h"

namespace rlf::sim {

void log_bracket(const std::vector<double>& axis, double x, size_t& i, double& t) {
  x = std::clamp(x, axis.front(), axis.back());
  if (axis.size() == 1) {
    i = 0;
    t = 0;
    return;
  }
  i = size_t(std::upper_bound(axis.begin(), axis.end(), x) - axis.begin());
  i = std::min(std::max<size_t>(i, 1), axis.size() - 1) - 1;
  t = std::log(x / axis[i]) / std::log(axis[i + 1] / axis[i]);
}

double RateTable::clamp_rows(double r) const {
  return std::clamp(r, rows.front(), rows.back());
}

double RateTable::clamp_width(double w) const {
  return std::clamp(w, widths.front(), widths.back());
}

double RateTable::at(double r, double w) const {
  size_t i = 0, j = 0;
  double t = 0, u = 0;
  log_bracket(rows, r, i, t);
  log_bracket(widths, w, j, u);
  const size_t n = rows.size();
  auto log_rate = [&](size_t width_index, size_t row_index) {
    return std::log(
        rates[std::min(width_index, widths.size() - 1) * n + std::min(row_index, n - 1)]);
  };
  const double lower = (1 - t) * log_rate(j, i) + t * log_rate(j, i + 1);
  const double upper = (1 - t) * log_rate(j + 1, i) + t * log_rate(j + 1, i + 1);
  return std::exp((1 - u) * lower + u * upper);
}

void RateTable::validate(const std::string& source, const std::string& key) const {
  // The file's keys: KEY_rows, KEY_widths and KEYs (layer_rate_rows, ..., layer_rates).
  auto fail = [&](const std::string& suffix, const std::string& what) {
    throw ConfigError(source + ": cluster." + key + suffix + " " + what);
  };
  auto ascending_positive = [&](const std::vector<double>& axis, const char* suffix) {
    if (axis.empty()) fail(suffix, "must list at least one value");
    for (size_t k = 0; k < axis.size(); ++k) {
      if (!(axis[k] > 0) || !std::isfinite(axis[k]))
        fail(suffix, "must be positive finite numbers");
      if (k > 0 && !(axis[k] > axis[k - 1])) fail(suffix, "must be strictly ascending");
    }
  };
  ascending_positive(rows, "_rows");
  ascending_positive(widths, "_widths");
  if (rates.size() != rows.size() * widths.size())
    fail("s", "must hold widths x rows = " + std::to_string(rows.size() * widths.size()) +
                  " values, got " + std::to_string(rates.size()));
  for (double r : rates)
    if (!(r > 0) || !std::isfinite(r)) fail("s", "must be positive finite numbers");
}

std::vector<double> parse_number_list(const std::string& text, const std::string& what) {
  std::istringstream in(text);
  std::vector<double> values;
  std::string word;
  while (in >> word) {
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != word.size()) throw ConfigError(what + ": '" + word + "' is not a number");
    values.push_back(v);
  }
  return values;
}

std::string number_list(const std::vector<double>& values) {
  std::string out;
  char buffer[32];
  for (double v : values) {
    std::snprintf(buffer, sizeof buffer, "%.6g", v);
    if (!out.empty()) out += ' ';
    out += buffer;
  }
  return out;
}

}  // namespace rlf::sim
