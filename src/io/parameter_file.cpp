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

void write_string_attribute(hid_t object, const char* name, const std::string& value) {
  Handle type{H5Tcopy(H5T_C_S1), H5Tclose};
  H5Tset_size(type.id, value.size() + 1);
  Handle space{H5Screate(H5S_SCALAR), H5Sclose};
  Handle attr{H5Acreate2(object, name, type.id, space.id, H5P_DEFAULT, H5P_DEFAULT), H5Aclose};
  check(H5Awrite(attr.id, type.id, value.c_str()), std::string("writing attribute ") + name);
}

}  // namespace

void save_parameters(const std::string& path, const ModelConfig& config,
                     const ParameterLayout& layout, const float* params) {
  const std::string temporary = path + ".tmp";
  {
    Handle file{H5Fcreate(temporary.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose};
    if (file.id < 0) throw std::runtime_error("cannot create '" + temporary + "'");
    write_string_attribute(file.id, "format", kFormat);
    write_string_attribute(file.id, "model.name", config.name);
    write_int_attribute(file.id, "model.vocab_size", config.vocab_size);
    write_int_attribute(file.id, "model.d_model", config.d_model);
    write_int_attribute(file.id, "model.n_layers", config.n_layers);
    write_int_attribute(file.id, "model.n_heads", config.n_heads);
    write_int_attribute(file.id, "model.n_experts", config.n_experts);
    write_int_attribute(file.id, "model.top_k", config.top_k);
    write_int_attribute(file.id, "model.d_ff", config.d_ff);
    write_int_attribute(file.id, "model.shared_expert_d_ff", config.shared_expert_d_ff);
    Handle group{H5Gcreate2(file.id, "parameters", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                 H5Gclose};
    for (const ParameterTensor& t : layout.tensors()) {
      std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
      Handle space{H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose};
      Handle set{H5Dcreate2(group.id, t.name.c_str(), H5T_IEEE_F32LE, space.id, H5P_DEFAULT,
                            H5P_DEFAULT, H5P_DEFAULT),
                 H5Dclose};
      check(H5Dwrite(set.id, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, params + t.offset),
            "writing " + t.name);
    }
    check(H5Fflush(file.id, H5F_SCOPE_GLOBAL), "flushing " + temporary);
  }
  std::filesystem::rename(temporary, path);
}

void load_parameters(const std::string& path, const ParameterLayout& layout, float* params) {
  if (!std::filesystem::exists(path)) {
    throw ConfigError("parameter file '" + path + "' does not exist");
  }
  H5E_BEGIN_TRY {
    Handle file{H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose};
    if (file.id < 0) throw ConfigError("parameter file '" + path + "' is not an HDF5 file");
    for (const ParameterTensor& t : layout.tensors()) {
      const std::string name = "parameters/" + t.name;
      Handle set{H5Dopen2(file.id, name.c_str(), H5P_DEFAULT), H5Dclose};
      if (set.id < 0) {
        throw ConfigError("parameter file '" + path + "' has no tensor '" + t.name +
                          "': it was written for another model");
      }
      Handle space{H5Dget_space(set.id), H5Sclose};
      std::vector<hsize_t> dims(size_t(H5Sget_simple_extent_ndims(space.id)));
      H5Sget_simple_extent_dims(space.id, dims.data(), nullptr);
      if (std::vector<int64_t>(dims.begin(), dims.end()) != t.shape) {
        throw ConfigError("parameter file '" + path + "': tensor '" + t.name +
                          "' has another shape than the configured model");
      }
      check(H5Dread(set.id, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, params + t.offset),
            "reading " + t.name);
    }
  }
  H5E_END_TRY;
}

}  // namespace rlf
