// libFuzzer target: the checkpoint validation layer. A valid checkpoint of a micro model is
// written once; each input damages a copy of it (bytes flipped at chosen offsets, the file cut
// short, the sidecar's text replaced) and the copy must then be rejected with a ConfigError
// before HDF5 reads a tensor, and `--resume auto` must pass over it; an undamaged copy must
// verify and read back bit for bit. Anything else (a crash, another exception, a damaged file
// accepted) aborts.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "kernels/error.h"
#include "src/io/checkpoint.h"
#include "src/model/model_config.h"
#include "src/model/parameter_layout.h"
#include "tests/micro_model_config.h"

namespace {

namespace fs = std::filesystem;

struct Original {
  rlf::ModelConfig config = rlf::test::micro_config();
  rlf::ParameterLayout layout{config};
  std::vector<float> parameters, first, second;
  std::string file;     // the checkpoint's bytes
  std::string sidecar;  // its .crc32c text
  std::string run_dir;  // where inputs are tried
};

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

const Original& original() {
  static const Original o = [] {
    Original o;
    const size_t n = size_t(o.layout.total());
    // Tensors only: the layout's alignment padding is not stored, so it stays zero (as in the
    // buffers read back).
    float value = 0;
    for (std::vector<float>* v : {&o.parameters, &o.first, &o.second}) {
      v->assign(n, 0.0f);
      for (const rlf::ParameterTensor& t : o.layout.tensors()) {
        for (int64_t i = 0; i < t.numel; ++i) (*v)[size_t(t.offset + i)] = (value += 0.25f);
      }
    }
    o.run_dir =
        (fs::temp_directory_path() / ("rlfusion-fuzz-" + std::to_string(getpid()))).string();
    fs::remove_all(o.run_dir);
    rlf::CheckpointCounters counters;
    counters.step = 1;
    counters.step_rewards = {0.5};
    rlf::write_checkpoint(
        o.run_dir, o.config, o.layout, counters,
        {const_cast<float*>(o.parameters.data()), const_cast<float*>(o.first.data()),
         const_cast<float*>(o.second.data()), nullptr});
    const std::string path = rlf::checkpoint_path(o.run_dir, 1);
    o.file = read_all(path);
    o.sidecar = read_all(path + ".crc32c");
    // The static `o` is destroyed before atexit handlers registered during its construction
    // run, so the cleanup keeps its own copy of the path (deliberately never freed).
    static const std::string* const cleanup = new std::string(o.run_dir);
    std::atexit([] { fs::remove_all(*cleanup); });
    return o;
  }();
  return o;
}

void require(bool condition) {
  if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Original& o = original();
  std::string file = o.file, sidecar = o.sidecar;
  // Input: a mode byte, then (offset: u32, xor: u8) flips, or a cut length, or sidecar text.
  const uint8_t mode = size > 0 ? data[0] : 0;
  if (mode % 3 == 0) {
    for (size_t at = 1; at + 5 <= size; at += 5) {
      uint32_t offset = 0;
      std::memcpy(&offset, data + at, 4);
      file[offset % file.size()] = char(file[offset % file.size()] ^ data[at + 4]);
    }
  } else if (mode % 3 == 1 && size >= 5) {
    uint32_t keep = 0;
    std::memcpy(&keep, data + 1, 4);
    file.resize(keep % (file.size() + 1));
  } else if (mode % 3 == 2) {
    sidecar.assign(reinterpret_cast<const char*>(data) + std::min<size_t>(1, size),
                   size - std::min<size_t>(1, size));
  }
  const bool damaged = file != o.file || sidecar != o.sidecar;

  const std::string path = rlf::checkpoint_path(o.run_dir, 1);
  write_all(path, file);
  write_all(path + ".crc32c", sidecar);
  bool rejected = false;
  std::vector<float> parameters(o.parameters.size()), first(o.first.size()),
      second(o.second.size());
  try {
    rlf::read_checkpoint(path, o.config, o.layout,
                         {parameters.data(), first.data(), second.data(), nullptr});
  } catch (const rlf::ConfigError& e) {
    rejected = true;
    if (!damaged) std::fprintf(stderr, "undamaged checkpoint refused: %s\n", e.what());
  }
  if (!rejected) {
    // Accepted: it must hold exactly what was written. A sidecar that differs only in text the
    // parser ignores (trailing bytes) is still the same CRC and size.
    if (!(parameters == o.parameters && first == o.first && second == o.second)) {
      std::fprintf(stderr, "accepted, but read back different tensors (%zu floats)\n",
                   parameters.size());
      std::abort();
    }
    if (file != o.file) {
      std::fprintf(stderr, "accepted a damaged file\n");
      std::abort();
    }
  } else {
    require(damaged);
    require(rlf::find_resume_point("auto", o.run_dir).path.empty());
  }
  return 0;
}
