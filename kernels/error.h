// Error types shared by every layer. A ConfigError is the user's fault (bad option, file, layout)
// and maps to exit code 2 with one clear message; anything else is a bug or a system failure.
#pragma once

#include <stdexcept>
#include <string>

namespace rlf {

struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct OutOfDeviceMemory : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline constexpr int kExitConfigError = 2;

}  // namespace rlf
