// Where the CUDA libraries the backend needs (cuDNN, cuBLAS, NCCL) are found at run time, and
// loading them. The places are searched in this order; what the explicit path has comes from
// there, the rest all from the first place that has all of it, and only when no place has them all
// each library group (cuBLAS with cuBLASLt, cuDNN, NCCL) from the first place that has it:
//   1. RESNET_CUDA_LIBRARY_PATH (colon-separated folders), then LD_LIBRARY_PATH's folders;
//   2. the nvidia-* wheels (site-packages/nvidia/*/lib) of the active Python environment:
//      $VIRTUAL_ENV, $CONDA_PREFIX, else the site-packages of the `python3` on PATH;
//   3. the cache: `resnet-cuda install-cuda`'s cuda-runtime-*/lib, then scripts/setup-cuda-sdk's
//      cuda-sdk-*/lib (under $RESNET_CUDA_CACHE, else $XDG_CACHE_HOME/resnet-cuda, else
//      ~/.cache/resnet-cuda);
//   4. the system's CUDA: $CUDA_HOME, $CUDA_PATH, /usr/local/cuda, then the dynamic loader's own
//      search (ld.so.cache, the system's library folders).
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace rc {

// One place to look in: a set of folders searched together.
struct CudaLibraryPlace {
  std::string kind;   // explicit, python, cache, system
  std::string label;  // what it is, for people: "Python environment /venv/lib/python3.12/site-packages"
  std::vector<std::string> dirs;
  bool loaderSearch = false;  // the dynamic loader's own search by soname (no folders)
};

// One shared library of a group, and what became of it.
struct CudaLibraryRecord {
  std::string name;     // cuDNN, cuBLAS, cuBLASLt, NCCL, NVRTC
  std::string soname;   // libcudnn.so.9
  std::string package;  // the pip package that provides it
  bool required = true;
  bool found = false;   // a file (or, for the loader's search, a loadable library) was found
  bool loaded = false;  // dlopen succeeded (only when loading was asked for)
  std::string path;
  std::string place;    // the label of the place it came from
  std::string version;  // from the library itself (loaded only)
  std::string error;    // why a library that was found did not load
};

struct CudaLibrarySearch {
  std::vector<CudaLibraryPlace> places;
  std::vector<std::string> notes;  // what could not be searched (a python3 that did not answer)
  std::vector<CudaLibraryRecord> libraries;
  bool load = false;
  // Whether every required library was found (and loaded, when loading was asked for).
  bool complete() const;
  // The required libraries that are missing or did not load, with why, "" when complete.
  std::string missing() const;
};

// An environment variable's value ("" when unset), so tests can give a made-up environment.
using EnvLookup = std::function<std::string(const std::string&)>;

// The real environment.
std::string processEnv(const std::string& name);

// The places to search, in order. Asks the python3 on PATH for its site-packages (waiting at most
// pythonTimeoutMs) only when neither VIRTUAL_ENV nor CONDA_PREFIX is set; a failure is a note.
std::vector<CudaLibraryPlace> cudaLibraryPlaces(const EnvLookup& env, int pythonTimeoutMs,
                                                std::vector<std::string>* notes);

// Finds each library in `places` and, with `load`, opens them RTLD_GLOBAL (in dependency order)
// and reads their versions. Without `load` only files are looked for (the loader's search is
// skipped: it cannot be asked without loading).
CudaLibrarySearch findCudaLibraries(const EnvLookup& env, bool load, int pythonTimeoutMs);

}  // namespace rc
