// cublas_library.h: dlopen of the toolkit's libcublas, then dlsym of the four entry points.
#include "kernels/cuda/cublas_library.h"

#include <dlfcn.h>

#include <initializer_list>

namespace rlf::cuda::detail {
namespace {

// cublas_v2.h maps the API names onto versioned symbols (cublasCreate -> cublasCreate_v2); the
// macro expansion gives the symbol name to look up.
#define RLF_SYMBOL_NAME(name) RLF_SYMBOL_TEXT(name)
#define RLF_SYMBOL_TEXT(name) #name

struct Loaded {
  CublasFunctions functions;
  bool ok = false;
  std::string error;
};

template <typename Function>
bool resolve(void* library, const char* symbol, Function& out, std::string& error) {
  out = reinterpret_cast<Function>(dlsym(library, symbol));
  if (!out) error = std::string("libcublas has no symbol ") + symbol;
  return out != nullptr;
}

Loaded load() {
  Loaded loaded;
  void* library = nullptr;
  // The toolkit the build found first (RLFUSION_CUBLAS_PATH), then the loader's search path
  // (LD_LIBRARY_PATH, ldconfig) for a machine whose toolkit lives elsewhere.
  for (const char* name : {RLFUSION_CUBLAS_PATH, RLFUSION_CUBLAS_SONAME, "libcublas.so"}) {
    library = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (library) break;
    if (loaded.error.empty()) loaded.error = dlerror();
  }
  if (!library) return loaded;
  loaded.error.clear();
  CublasFunctions& f = loaded.functions;
  loaded.ok = resolve(library, RLF_SYMBOL_NAME(cublasCreate), f.create, loaded.error) &&
              resolve(library, RLF_SYMBOL_NAME(cublasSetStream), f.set_stream, loaded.error) &&
              resolve(library, RLF_SYMBOL_NAME(cublasSetMathMode), f.set_math_mode, loaded.error) &&
              resolve(library, RLF_SYMBOL_NAME(cublasSgemm), f.sgemm, loaded.error);
  // The library stays open for the life of the process: handles made from it are never destroyed.
  return loaded;
}

const Loaded& loaded() {
  static const Loaded result = load();
  return result;
}

}  // namespace

const CublasFunctions* cublas_functions() {
  return loaded().ok ? &loaded().functions : nullptr;
}

std::string cublas_load_error() {
  return loaded().error;
}

}  // namespace rlf::cuda::detail
