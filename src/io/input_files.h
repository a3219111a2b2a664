// Where named inputs live: `--model small` or `--task sort` name INI files under inputs/.
#pragma once

#include <string>

namespace rlf {

// A path (contains '/' or ends in .ini) is returned as is. A bare name is looked up as
// <kind>/<name>.ini under ./inputs (a run from a checkout), then under $RLFUSION_INPUTS, then
// under the inputs/ of the source tree this binary was built from; when none has it, the
// ./inputs path is returned so the error names where it was expected.
std::string resolve_input_file(const std::string& kind, const std::string& name_or_path);

}  // namespace rlf
