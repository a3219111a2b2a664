// Small HDF5 C-API helpers shared by the parameter and checkpoint files: a closing handle,
// scalar attributes, the model shape as root attributes, and float tensors with their shapes.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

#include "src/model/model_config.h"

namespace rlf::hdf5 {

// Closes an HDF5 handle on scope exit.
struct Handle {
  hid_t id;
  herr_t (*close)(hid_t);
  ~Handle() {
    if (id >= 0) close(id);
  }
};

// std::runtime_error("HDF5: <what> failed") when status < 0.
void check(herr_t status, const std::string& what);

void write_int_attribute(hid_t object, const char* name, long long value);
void write_double_attribute(hid_t object, const char* name, double value);
void write_string_attribute(hid_t object, const char* name, const std::string& value);
// "" when the attribute is missing.
std::string read_string_attribute(hid_t object, const char* name);
// `label` names the file in errors, e.g. "parameter file 'model.h5'".
// ConfigError naming the file when the attribute is missing.
double read_number_attribute(hid_t object, const std::string& label, const char* name);

// Every ModelConfig field as a `model.*` attribute of `object`, and back (validated).
void write_model_attributes(hid_t object, const ModelConfig& config);
ModelConfig read_model_attributes(hid_t object, const std::string& label);

// A little-endian float dataset `name` in `group`.
void write_tensor(hid_t group, const std::string& name, const std::vector<int64_t>& shape,
                  const float* data);
// Reads dataset `name` of `group` into `data`; ConfigError naming the file when it is missing or
// has another shape.
void read_tensor(hid_t group, const std::string& label, const std::string& name,
                 const std::vector<int64_t>& shape, float* data);

// Opens an existing HDF5 file read-only; ConfigError "<what> '<path>' ..." otherwise.
hid_t open_read_only(const std::string& path, const std::string& what);

}  // namespace rlf::hdf5
