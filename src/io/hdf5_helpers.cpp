#include "src/io/hdf5_helpers.h"

#include <filesystem>
#include <stdexcept>

#include "kernels/error.h"

namespace rlf::hdf5 {

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

std::string read_string_attribute(hid_t object, const char* name) {
  if (H5Aexists(object, name) <= 0) return "";
  Handle attr{H5Aopen(object, name, H5P_DEFAULT), H5Aclose};
  Handle type{H5Aget_type(attr.id), H5Tclose};
  std::string value(H5Tget_size(type.id), '\0');
  check(H5Aread(attr.id, type.id, value.data()), std::string("reading attribute ") + name);
  return value.substr(0, value.find('\0'));
}

double read_number_attribute(hid_t object, const std::string& label, const char* name) {
  if (H5Aexists(object, name) <= 0) {
    throw ConfigError(label + " has no attribute '" + name +
                      "' (written by an older rlfusion, or not an rlfusion file)");
  }
  Handle attr{H5Aopen(object, name, H5P_DEFAULT), H5Aclose};
  double value = 0;
  check(H5Aread(attr.id, H5T_NATIVE_DOUBLE, &value), std::string("reading attribute ") + name);
  return value;
}

void write_model_attributes(hid_t object, const ModelConfig& config) {
  write_string_attribute(object, "model.name", config.name);
  write_int_attribute(object, "model.vocab_size", config.vocab_size);
  write_int_attribute(object, "model.d_model", config.d_model);
  write_int_attribute(object, "model.n_layers", config.n_layers);
  write_int_attribute(object, "model.n_heads", config.n_heads);
  write_int_attribute(object, "model.n_experts", config.n_experts);
  write_int_attribute(object, "model.top_k", config.top_k);
  write_int_attribute(object, "model.d_ff", config.d_ff);
  write_int_attribute(object, "model.shared_expert_d_ff", config.shared_expert_d_ff);
  write_int_attribute(object, "model.max_seq_len", config.max_seq_len);
  write_double_attribute(object, "model.rope_theta", config.rope_theta);
  write_double_attribute(object, "model.norm_eps", config.norm_eps);
  write_double_attribute(object, "model.init_std", config.init_std);
  write_int_attribute(object, "model.normalize_topk", config.normalize_topk);
  write_double_attribute(object, "model.aux_loss_coef", config.aux_loss_coef);
}

ModelConfig read_model_attributes(hid_t object, const std::string& label) {
  ModelConfig c;
  c.name = read_string_attribute(object, "model.name");
  auto integer = [&](const char* name) { return int(read_number_attribute(object, label, name)); };
  auto real = [&](const char* name) { return float(read_number_attribute(object, label, name)); };
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
  c.validate(label);
  return c;
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

void read_tensor(hid_t group, const std::string& label, const std::string& name,
                 const std::vector<int64_t>& shape, float* data) {
  Handle set{-1, H5Dclose};
  H5E_BEGIN_TRY {
    set.id = H5Dopen2(group, name.c_str(), H5P_DEFAULT);
  }
  H5E_END_TRY;
  if (set.id < 0) {
    throw ConfigError(label + " has no tensor '" + name + "': it was written for another model");
  }
  Handle space{H5Dget_space(set.id), H5Sclose};
  std::vector<hsize_t> dims(size_t(H5Sget_simple_extent_ndims(space.id)));
  H5Sget_simple_extent_dims(space.id, dims.data(), nullptr);
  if (std::vector<int64_t>(dims.begin(), dims.end()) != shape) {
    throw ConfigError(label + ": tensor '" + name +
                      "' has another shape than the configured model");
  }
  check(H5Dread(set.id, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "reading " + name);
}

hid_t open_read_only(const std::string& path, const std::string& what) {
  if (!std::filesystem::exists(path)) throw ConfigError(what + " '" + path + "' does not exist");
  hid_t file = -1;
  H5E_BEGIN_TRY {
    file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  }
  H5E_END_TRY;
  if (file < 0) throw ConfigError(what + " '" + path + "' is not an HDF5 file");
  return file;
}

}  // namespace rlf::hdf5
