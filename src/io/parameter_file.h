// Model parameters in HDF5: one dataset per named tensor under /parameters, the model shape as
// attributes of the root group. Written to a temporary name and renamed, so an existing file is
// never half-overwritten. (Full restartable checkpoints with optimizer and RNG state come later.)
#pragma once

#include <string>

#include "src/model/model_config.h"
#include "src/model/parameter_layout.h"

namespace rlf {

void save_parameters(const std::string& path, const ModelConfig& config,
                     const ParameterLayout& layout, const float* params);
// Throws ConfigError if the file is missing, unreadable, or its tensors do not match `layout`.
void load_parameters(const std::string& path, const ParameterLayout& layout, float* params);

}  // namespace rlf
