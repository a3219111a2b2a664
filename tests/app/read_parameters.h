// Reads the parameters a run of the tiny model saved (model.h5), for tests that compare runs bit
// for bit.
#pragma once

#include <string>
#include <vector>

#include "src/io/parameter_file.h"
#include "src/model/model_config.h"
#include "src/model/parameter_layout.h"

namespace rlf::test {

inline std::vector<float> read_tiny_parameters(const std::string& path) {
  const ModelConfig config =
      load_model_config(std::string(RLFUSION_SOURCE_DIR) + "/inputs/models/tiny.ini");
  const ParameterLayout layout(config);
  std::vector<float> params(size_t(layout.total()));
  load_parameters(path, layout, params.data());
  return params;
}

// The parameters of whichever model the file was saved with.
inline std::vector<float> read_saved_parameters(const std::string& path) {
  const ParameterLayout layout(parameter_file_model(path));
  std::vector<float> params(size_t(layout.total()));
  load_parameters(path, layout, params.data());
  return params;
}

}  // namespace rlf::test
