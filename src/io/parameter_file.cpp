#include "src/io/parameter_file.h"

#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <vector>

#include "kernels/error.h"
#include "src/io/hdf5_helpers.h"

namespace rlf {

using namespace hdf5;

namespace {

constexpr const char* kFormat = "rlfusion-parameters-1";

const char* kind_name(ParameterFileKind kind) {
  return kind == ParameterFileKind::RewardModel ? "reward-model" : "policy";
}

// Opens an existing parameter file read-only; ConfigError naming it otherwise.
hid_t open_parameter_file(const std::string& path) {
  return open_read_only(path, "parameter file");
}

std::string label(const std::string& path) {
  return "parameter file '" + path + "'";
}

ParameterFileKind read_kind(hid_t file, const std::string& path) {
  const std::string kind = read_string_attribute(file, "kind");
  if (kind.empty() || kind == "policy") return ParameterFileKind::Policy;
  if (kind == "reward-model") return ParameterFileKind::RewardModel;
  throw ConfigError("parameter file '" + path + "' holds an unknown kind '" + kind + "'");
}

void check_kind(ParameterFileKind found, ParameterFileKind expected, const std::string& path) {
  if (found == expected) return;
  if (found == ParameterFileKind::RewardModel) {
    throw ConfigError("parameter file '" + path +
                      "' holds a reward model (written by rlfusion sft --reward-model), not a "
                      "policy: pass it to train as --reward-model");
  }
  throw ConfigError("parameter file '" + path +
                    "' holds a policy, not a reward model: write one with rlfusion sft "
                    "--reward-model");
}

}  // namespace

void save_parameters(const std::string& path, const ModelConfig& config,
                     const ParameterLayout& layout, const float* params, ParameterFileKind kind,
                     const std::vector<ExtraTensor>& extra) {
  const std::string temporary = path + ".tmp";
  {
    Handle file{H5Fcreate(temporary.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose};
    if (file.id < 0) throw std::runtime_error("cannot create '" + temporary + "'");
    write_string_attribute(file.id, "format", kFormat);
    write_string_attribute(file.id, "kind", kind_name(kind));
    write_model_attributes(file.id, config);
    Handle group{H5Gcreate2(file.id, "parameters", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                 H5Gclose};
    for (const ParameterTensor& t : layout.tensors()) {
      write_tensor(group.id, t.name, t.shape, params + t.offset);
    }
    for (const ExtraTensor& t : extra) write_tensor(group.id, t.name, {t.count}, t.data);
    check(H5Fflush(file.id, H5F_SCOPE_GLOBAL), "flushing " + temporary);
  }
  std::filesystem::rename(temporary, path);
}

void load_parameters(const std::string& path, const ParameterLayout& layout, float* params,
                     ParameterFileKind kind, const std::vector<ExtraTensor>& extra) {
  Handle file{open_parameter_file(path), H5Fclose};
  check_kind(read_kind(file.id, path), kind, path);
  Handle group{-1, H5Gclose};
  H5E_BEGIN_TRY {
    group.id = H5Gopen2(file.id, "parameters", H5P_DEFAULT);
  }
  H5E_END_TRY;
  if (group.id < 0) throw ConfigError(label(path) + " has no /parameters group");
  for (const ParameterTensor& t : layout.tensors()) {
    read_tensor(group.id, label(path), t.name, t.shape, params + t.offset);
  }
  for (const ExtraTensor& t : extra) read_tensor(group.id, label(path), t.name, {t.count}, t.data);
}

void check_parameter_file_kind(const std::string& path, ParameterFileKind expected) {
  Handle file{open_parameter_file(path), H5Fclose};
  check_kind(read_kind(file.id, path), expected, path);
}

ModelConfig parameter_file_model(const std::string& path) {
  Handle file{open_parameter_file(path), H5Fclose};
  return read_model_attributes(file.id, label(path));
}

}  // namespace rlf
