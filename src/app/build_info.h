// What this binary was built with: printed by `rlfusion --version` and at the top of every run log.
#pragma once

#include <string>

namespace rlf {
std::string build_info();
}
