#include "src/io/parameter_file.h"

#include <hdf5.h>

#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <vector>

#include "kernels/error.h"

namespace rlf {

namespace {

constexpr const char* kFormat = "rlfusion-parameters-1";

// Closes an HDF5 handle on scope exit.
struct Handle {
  hid_t id;
  herr_t (*close)(hid_t);
  ~Handle() {
    if (id >= 0) close(id);
  }
};

void check(herr_t status, const std::string& what) {
  if (status < 0) throw std::runtime_error("HDF5: " + what + " failed");
}

void write_int_attribute(hid_t object, const char* name, long long value) {
  Handle space{H5Screate(H5S_SCALAR), H5Sclose};
  Handle attr{H5Acreate2(object, name, H5T_NATIVE_LLONG, space.id, H5P_DEFAULT, H5P_DEFAULT),
              H5Aclose};
  check(H5Awrite(attr.id, H5T_NATIVE_LLONG, &value), std::string("writing attribute ") + name);
}

void write_double_attribute(hid_t object, const char* name, double value) {
  Handle space{H5Screate(H5S_SCALAR), H5Sclose};
  Handle attr{H5Acreate2(object, name, H5T_NATIVE_DOUBLE, space.id, H5P_DEFAULT, H5P_DEFAULT),
              H5Aclose};
  check(H5Awrite(attr.id, H5T_NATIVE_DOUBLE, &value), std::string("writing attribute ") + name);
}

void write_string_attribute(hid_t object, const char* name, const std::string& value) {
  Handle type{H5Tcopy(H5T_C_S1), H5Tclose};
  H5Tset_size(type.id, value.size() + 1);
  Handle space{H5Screate(H5S_SCALAR), H5Sclose};
  Handle attr{H5Acreate2(object, name, type.id, space.id, H5P_DEFAULT, H5P_DEFAULT), H5Aclose};
  check(H5Awrite(attr.id, type.id, value.c_str()), std::string("writing attribute ") + name);
}

const char* kind_name(ParameterFileKind kind) {
  return kind == ParameterFileKind::RewardModel ? "reward-model" : "policy";
}

// Opens an existing parameter file read-only; ConfigError naming it otherwise.
hid_t open_parameter_file(const std::string& path) {
  if (!std::filesystem::exists(path)) {
    throw ConfigError("parameter file '" + path + "' does not exist");
  }
  hid_t file = -1;
  H5E_BEGIN_TRY {
    file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  }
  H5E_END_TRY;
  if (file < 0) throw ConfigError("parameter file '" + path + "' is not an HDF5 file");
  return file;
}

std::string read_string_attribute(hid_t object, const char* name) {
  if (H5Aexists(object, name) <= 0) return "";
  Handle attr{H5Aopen(object, name, H5P_DEFAULT), H5Aclose};
  Handle type{H5Aget_type(attr.id), H5Tclose};
  std::string value(H5Tget_size(type.id), '\0');
  check(H5Aread(attr.id, type.id, value.data()), std::string("reading attribute ") + name);
  return value.substr(0, value.find('\0'));
}

template <typename Number>
Number read_number_attribute(hid_t object, const std::string& path, const char* name) {
  if (H5Aexists(object, name) <= 0) {
    throw ConfigError("parameter file '" + path + "' has no attribute '" + name +
                      "' (written by an older rlfusion)");
  }
  Handle attr{H5Aopen(object, name, H5P_DEFAULT), H5Aclose};
  double value = 0;
  check(H5Aread(attr.id, H5T_NATIVE_DOUBLE, &value), std::string("reading attribute ") + name);
  return Number(value);
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

void read_tensor(hid_t file, const std::string& path, const std::string& name,
                 const std::vector<int64_t>& shape, float* data) {
  const std::string dataset = "parameters/" + name;
  Handle set{H5Dopen2(file, dataset.c_str(), H5P_DEFAULT), H5Dclose};
  if (set.id < 0) {
    throw ConfigError("parameter file '" + path + "' has no tensor '" + name +
                      "': it was written for another model");
  }
  Handle space{H5Dget_space(set.id), H5Sclose};
  std::vector<hsize_t> dims(size_t(H5Sget_simple_extent_ndims(space.id)));
  H5Sget_simple_extent_dims(space.id, dims.data(), nullptr);
  if (std::vector<int64_t>(dims.begin(), dims.end()) != shape) {
    throw ConfigError("parameter file '" + path + "': tensor '" + name +
                      "' has another shape than the configured model");
  }
  check(H5Dread(set.id, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "reading " + name);
}

void write_tensor(hid_t group, const std::string& name, const std::vector<int64_t>& shape,
                  const float* data) {
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  Handle space{H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose};
  Handle set{H5Dcreate2(group, name.c_str(), H5T_IEEE_F32LE, space.id, H5P_DEFAULT, H5P_DEFAULT,
                        H5P_DEFAULT),
             H5Dclose};
  check(H5Dwrite(set.id, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "writing " + name);
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
    write_string_attribute(file.id, "model.name", config.name);
    write_int_attribute(file.id, "model.vocab_size", config.vocab_size);
    write_int_attribute(file.id, "model.d_model", config.d_model);
    write_int_attribute(file.id, "model.n_layers", config.n_layers);
    write_int_attribute(file.id, "model.n_heads", config.n_heads);
    write_int_attribute(file.id, "model.n_experts", config.n_experts);
    write_int_attribute(file.id, "model.top_k", config.top_k);
    write_int_attribute(file.id, "model.d_ff", config.d_ff);
    write_int_attribute(file.id, "model.shared_expert_d_ff", config.shared_expert_d_ff);
    write_int_attribute(file.id, "model.max_seq_len", config.max_seq_len);
    write_double_attribute(file.id, "model.rope_theta", config.rope_theta);
    write_double_attribute(file.id, "model.norm_eps", config.norm_eps);
    write_double_attribute(file.id, "model.init_std", config.init_std);
    write_int_attribute(file.id, "model.normalize_topk", config.normalize_topk);
    write_double_attribute(file.id, "model.aux_loss_coef", config.aux_loss_coef);
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
  H5E_BEGIN_TRY {
    for (const ParameterTensor& t : layout.tensors()) {
      read_tensor(file.id, path, t.name, t.shape, params + t.offset);
    }
    for (const ExtraTensor& t : extra) read_tensor(file.id, path, t.name, {t.count}, t.data);
  }
  H5E_END_TRY;
}

void check_parameter_file_kind(const std::string& path, ParameterFileKind expected) {
  Handle file{open_parameter_file(path), H5Fclose};
  check_kind(read_kind(file.id, path), expected, path);
}

ModelConfig parameter_file_model(const std::string& path) {
  Handle file{open_parameter_file(path), H5Fclose};
  ModelConfig c;
  c.name = read_string_attribute(file.id, "model.name");
  auto integer = [&](const char* name) { return read_number_attribute<int>(file.id, path, name); };
  auto real = [&](const char* name) { return read_number_attribute<float>(file.id, path, name); };
  c.vocab_size = integer("model.vocab_size");
  c.d_model = integer("model.d_model");
  c.n_layers = integer("model.n_layers");
  c.n_heads = integer("model.n_heads");
  c.n_experts = integer("model.n_experts");
  c.top_k = integer("model.top_k");
  c.d_ff = integer("model.d_ff");
  c.shared_expert_d_ff = integer("model.shared_expert_d_ff");
  c.max_seq_len = integer("model.max_seq_len");
  c.rope_theta = real("model.rope_theta");
  c.norm_eps = real("model.norm_eps");
  c.init_std = real("model.init_std");
  c.normalize_topk = integer("model.normalize_topk") != 0;
  c.aux_loss_coef = real("model.aux_loss_coef");
  c.validate("parameter file '" + path + "'");
  return c;
}

}  // namespace rlf
