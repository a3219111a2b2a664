// Model parameters in HDF5: one dataset per named tensor under /parameters, the model shape as
// attributes of the root group. Written to a temporary name and renamed, so an existing file is
// never half-overwritten. (Full restartable checkpoints with optimizer and RNG state come later.)
// A `kind` attribute says what the file holds (a policy, or a learned reward model whose scalar
// head is stored as extra tensors), so passing one where the other is expected is a clear error;
// a file without it is a policy.
#pragma once

#include <string>
#include <vector>

#include "src/model/model_config.h"
#include "src/model/parameter_layout.h"

namespace rlf {

enum class ParameterFileKind { Policy, RewardModel };

// A 1-D tensor stored next to the layout's tensors (a reward model's head).
struct ExtraTensor {
  std::string name;
  int64_t count = 0;
  float* data = nullptr;
};

void save_parameters(const std::string& path, const ModelConfig& config,
                     const ParameterLayout& layout, const float* params,
                     ParameterFileKind kind = ParameterFileKind::Policy,
                     const std::vector<ExtraTensor>& extra = {});
// Throws ConfigError if the file is missing, unreadable, holds another kind, or its tensors do
// not match `layout` and `extra`.
void load_parameters(const std::string& path, const ParameterLayout& layout, float* params,
                     ParameterFileKind kind = ParameterFileKind::Policy,
                     const std::vector<ExtraTensor>& extra = {});
// ConfigError naming the file unless it exists, is an HDF5 file and holds `expected`.
void check_parameter_file_kind(const std::string& path, ParameterFileKind expected);
// The model shape the file was written with (every ModelConfig field).
ModelConfig parameter_file_model(const std::string& path);

}  // namespace rlf
