#include "cuda_libraries.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <glob.h>
#include <link.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <set>
#include <sstream>

extern char** environ;

namespace rc {

namespace {

// The libraries, in the order they must be loaded: libcublas.so.13 needs libcublasLt.so.13, and
// cuDNN dlopens libcublasLt.so.13 (and libnvrtc.so.13) by soname, which its RUNPATH does not find
// in the CUDA 13 wheels' layout (nvidia/cu13/lib). A group's libraries come from one place.
struct LibrarySpec {
  const char* name;
  const char* soname;
};
struct GroupSpec {
  const char* package;
  bool required;
  std::vector<LibrarySpec> libraries;
};
const std::vector<GroupSpec>& groups() {
  static const std::vector<GroupSpec> kGroups = {
      {"nvidia-cublas", true, {{"cuBLASLt", "libcublasLt.so.13"}, {"cuBLAS", "libcublas.so.13"}}},
      {"nvidia-cudnn-cu13", true, {{"cuDNN", "libcudnn.so.9"}}},
      {"nvidia-nccl-cu13", true, {{"NCCL", "libnccl.so.2"}}},
      // Optional: only cuDNN's runtime-compiled engines use it; without it cuDNN uses the others.
      {"nvidia-cuda-nvrtc", false, {{"NVRTC", "libnvrtc.so.13"}}},
      // Optional: only decoding JPEGs on the device uses it, and says so when it is missing.
      {"nvidia-nvjpeg", false, {{"nvJPEG", "libnvjpeg.so.13"}}},
  };
  return kGroups;
}

std::vector<std::string> globDirs(const std::string& pattern) {
  std::vector<std::string> out;
  glob_t g{};
  if (glob(pattern.c_str(), GLOB_ONLYDIR, nullptr, &g) == 0) out.assign(g.gl_pathv, g.gl_pathv + g.gl_pathc);
  globfree(&g);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> splitColons(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ':');) {
    if (!part.empty()) out.push_back(part);
  }
  return out;
}

// The first executable `name` in the folders of `path` (a PATH value), "" when there is none.
std::string findExecutable(const std::string& name, const std::string& path) {
  for (const auto& dir : splitColons(path)) {
    const std::string candidate = dir + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// Runs `argv` with stdout captured, waiting at most timeoutMs for it to finish. Returns false with
// `why` when it cannot be started, runs too long (it is then killed) or exits non-zero.
bool runCaptured(const std::vector<std::string>& argv, int timeoutMs, std::string* out, std::string* why) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    *why = "cannot create a pipe";
    return false;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (spawned != 0) {
    close(fds[0]);
    *why = "cannot be started";
    return false;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
  auto leftMs = [&] {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    return static_cast<int>(std::max<int64_t>(0, left.count()));
  };
  bool timedOut = false;
  char buffer[4096];
  for (;;) {
    pollfd p{fds[0], POLLIN, 0};
    const int ready = poll(&p, 1, leftMs());
    if (ready == 0) {
      timedOut = true;
      break;
    }
    if (ready < 0) continue;  // EINTR
    const ssize_t n = read(fds[0], buffer, sizeof(buffer));
    if (n <= 0) break;
    if (out->size() < (1 << 16)) out->append(buffer, static_cast<size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  while (!timedOut) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0 || leftMs() == 0) {
      timedOut = done >= 0;
      break;
    }
    usleep(2000);
  }
  if (timedOut) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    *why = "did not answer within " + std::to_string(timeoutMs) + " ms";
    return false;
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    *why = "failed";
    return false;
  }
  return true;
}

// The site-packages folders of the python3 on PATH, in its import order.
std::vector<std::string> askPython(const EnvLookup& env, int timeoutMs, std::vector<std::string>* notes) {
  const std::string python = findExecutable("python3", env("PATH"));
  if (python.empty()) return {};
  std::string out;
  std::string why;
  const bool ok = runCaptured(
      {python, "-c", "import sys\nfor p in sys.path:\n  if p.endswith(('site-packages', 'dist-packages')): print(p)\n"},
      timeoutMs, &out, &why);
  if (!ok) {
    notes->push_back(python + " (asked for its site-packages) " + why);
    return {};
  }
  std::vector<std::string> dirs;
  std::stringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] == '/') dirs.push_back(line);
  }
  return dirs;
}

void addPythonPlace(const std::string& sitePackages, std::vector<CudaLibraryPlace>* places) {
  places->push_back({"python", "Python environment " + sitePackages, globDirs(sitePackages + "/nvidia/*/lib")});
}

std::string cacheRoot(const EnvLookup& env) {
  const std::string explicitRoot = env("RESNET_CUDA_CACHE");
  if (!explicitRoot.empty()) return explicitRoot;
  const std::string xdg = env("XDG_CACHE_HOME");
  if (!xdg.empty()) return xdg + "/resnet-cuda";
  const std::string home = env("HOME");
  return home.empty() ? std::string() : home + "/.cache/resnet-cuda";
}

// "9.13.1" from a version number packed as major * 10000 + minor * 100 + patch.
std::string packedVersion(long long v) {
  return std::to_string(v / 10000) + "." + std::to_string((v % 10000) / 100) + "." + std::to_string(v % 100);
}

// The version a loaded library reports about itself, "" when it has no such entry point.
std::string libraryVersion(void* handle, const std::string& name) {
  if (name == "cuDNN") {
    auto fn = reinterpret_cast<size_t (*)()>(dlsym(handle, "cudnnGetVersion"));
    return fn ? packedVersion(static_cast<long long>(fn())) : "";
  }
  if (name == "cuBLASLt") {
    auto fn = reinterpret_cast<size_t (*)()>(dlsym(handle, "cublasLtGetVersion"));
    return fn ? packedVersion(static_cast<long long>(fn())) : "";
  }
  if (name == "cuBLAS") {
    // cublasGetProperty(libraryPropertyType, int*): MAJOR_VERSION 0, MINOR_VERSION 1, PATCH_LEVEL 2.
    auto fn = reinterpret_cast<int (*)(int, int*)>(dlsym(handle, "cublasGetProperty"));
    int part[3] = {0, 0, 0};
    if (fn == nullptr) return "";
    for (int i = 0; i < 3; ++i) {
      if (fn(i, &part[i]) != 0) return "";
    }
    return std::to_string(part[0]) + "." + std::to_string(part[1]) + "." + std::to_string(part[2]);
  }
  if (name == "NCCL") {
    auto fn = reinterpret_cast<int (*)(int*)>(dlsym(handle, "ncclGetVersion"));
    int v = 0;
    return fn && fn(&v) == 0 ? packedVersion(v) : "";
  }
  if (name == "NVRTC") {
    auto fn = reinterpret_cast<int (*)(int*, int*)>(dlsym(handle, "nvrtcVersion"));
    int major = 0;
    int minor = 0;
    return fn && fn(&major, &minor) == 0 ? std::to_string(major) + "." + std::to_string(minor) : "";
  }
  return "";
}

// The file a handle was loaded from.
std::string loadedPath(void* handle, const std::string& fallback) {
  link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr && map->l_name[0]) {
    return map->l_name;
  }
  return fallback;
}

// The file of `soname` in the place's folders (the first folder that has it), "" when none.
std::string fileIn(const CudaLibraryPlace& place, const char* soname) {
  for (const auto& dir : place.dirs) {
    const std::string path = dir + "/" + soname;
    if (access(path.c_str(), F_OK) == 0) return path;
  }
  return "";
}

bool placeHasGroup(const CudaLibraryPlace& place, const GroupSpec& group) {
  return std::all_of(group.libraries.begin(), group.libraries.end(),
                     [&](const LibrarySpec& lib) { return !fileIn(place, lib.soname).empty(); });
}

// Opens each library of `group` from `place` (its files, or by soname for the loader's search),
// filling `records`; false (with the first failure recorded) when one does not load.
bool loadGroup(const GroupSpec& group, const CudaLibraryPlace& place, std::vector<CudaLibraryRecord>* records) {
  for (size_t i = 0; i < group.libraries.size(); ++i) {
    CudaLibraryRecord& r = (*records)[i];
    const std::string target =
        place.loaderSearch ? std::string(group.libraries[i].soname) : fileIn(place, r.soname.c_str());
    void* handle = dlopen(target.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (handle == nullptr) {
      const char* message = dlerror();
      const std::string why = message != nullptr ? message : "unknown error";
      // By soname, "cannot open shared object file" only means the loader does not know it.
      if (place.loaderSearch && why.find("cannot open shared object file") != std::string::npos) return false;
      r.found = true;
      r.path = target;
      r.place = place.label;
      r.error = why;
      return false;
    }
    r.found = true;
    r.loaded = true;
    r.error.clear();
    r.path = loadedPath(handle, target);
    r.place = place.label;
    r.version = libraryVersion(handle, r.name);
  }
  return true;
}

}  // namespace

std::string processEnv(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  return value != nullptr ? std::string(value) : std::string();
}

bool CudaLibrarySearch::complete() const { return missing().empty(); }

std::string CudaLibrarySearch::missing() const {
  std::string out;
  for (const auto& r : libraries) {
    if (!r.required || (r.found && (!load || r.loaded))) continue;
    out += out.empty() ? "" : "; ";
    out +=
        r.name + " (" + r.soname + ") " + (r.found ? "does not load from " + r.path + ": " + r.error : "was not found");
  }
  return out;
}

std::vector<CudaLibraryPlace> cudaLibraryPlaces(const EnvLookup& env, int pythonTimeoutMs,
                                                std::vector<std::string>* notes) {
  std::vector<CudaLibraryPlace> places;
  const std::vector<std::string> userDirs = splitColons(env("RESNET_CUDA_LIBRARY_PATH"));
  if (!userDirs.empty()) places.push_back({"explicit", "RESNET_CUDA_LIBRARY_PATH", userDirs});
  // The dynamic loader's own path is the user's word too: it comes before anything found here.
  const std::vector<std::string> loaderDirs = splitColons(env("LD_LIBRARY_PATH"));
  if (!loaderDirs.empty()) places.push_back({"explicit", "LD_LIBRARY_PATH", loaderDirs});

  const std::string venv = env("VIRTUAL_ENV");
  const std::string conda = env("CONDA_PREFIX");
  for (const auto& sp : venv.empty() ? std::vector<std::string>{} : globDirs(venv + "/lib/python3*/site-packages")) {
    addPythonPlace(sp, &places);
  }
  if (!conda.empty()) {
    for (const auto& sp : globDirs(conda + "/lib/python3*/site-packages")) addPythonPlace(sp, &places);
    // conda's own cudnn, libcublas and nccl packages install into the environment's lib.
    places.push_back({"python", "conda environment " + conda + "/lib", {conda + "/lib"}});
  }
  if (venv.empty() && conda.empty()) {
    for (const auto& sp : askPython(env, pythonTimeoutMs, notes)) addPythonPlace(sp, &places);
  }

  const std::string cache = cacheRoot(env);
  if (!cache.empty()) {
    for (const auto& dir : globDirs(cache + "/cuda-runtime-*/lib")) {
      places.push_back({"cache", "resnet-cuda install-cuda " + dir.substr(0, dir.size() - 4), {dir}});
    }
    for (const auto& dir : globDirs(cache + "/cuda-sdk-*/lib")) {
      places.push_back({"cache", "CUDA SDK " + dir.substr(0, dir.size() - 4), {dir}});
    }
  }

  std::set<std::string> roots;
  for (const std::string var : {"CUDA_HOME", "CUDA_PATH"}) {
    const std::string root = env(var);
    if (!root.empty() && roots.insert(root).second) {
      places.push_back({"system", var + " " + root, {root + "/lib64", root + "/lib"}});
    }
  }
  if (roots.insert("/usr/local/cuda").second) {
    places.push_back({"system", "/usr/local/cuda", {"/usr/local/cuda/lib64", "/usr/local/cuda/lib"}});
  }
  CudaLibraryPlace loader{"system", "the dynamic loader's search (ld.so.cache)", {}, true};
  places.push_back(loader);
  return places;
}

CudaLibrarySearch findCudaLibraries(const EnvLookup& env, bool load, int pythonTimeoutMs) {
  CudaLibrarySearch search;
  search.load = load;
  search.places = cudaLibraryPlaces(env, pythonTimeoutMs, &search.notes);
  // The first place (after an explicit path) that has every required group: all come from there
  // if they load, rather than each from the first place that has it.
  const CudaLibraryPlace* whole = nullptr;
  for (const auto& place : search.places) {
    if (place.loaderSearch || place.kind == "explicit") continue;
    if (std::all_of(groups().begin(), groups().end(),
                    [&](const GroupSpec& g) { return !g.required || placeHasGroup(place, g); })) {
      whole = &place;
      break;
    }
  }
  for (const GroupSpec& group : groups()) {
    std::vector<CudaLibraryRecord> records;
    for (const LibrarySpec& lib : group.libraries) {
      CudaLibraryRecord r;
      r.name = lib.name;
      r.soname = lib.soname;
      r.package = group.package;
      r.required = group.required;
      records.push_back(r);
    }
    // An explicit path wins for what it has; then the place that has everything; then each place.
    std::vector<const CudaLibraryPlace*> order;
    for (const auto& place : search.places) {
      if (place.kind == "explicit") order.push_back(&place);
    }
    if (whole != nullptr) order.push_back(whole);
    for (const auto& place : search.places) {
      if (&place != whole && place.kind != "explicit") order.push_back(&place);
    }
    std::vector<CudaLibraryRecord> firstFailure;
    bool done = false;
    for (const CudaLibraryPlace* place : order) {
      if (place->loaderSearch) {
        if (!load) continue;
      } else if (!placeHasGroup(*place, group)) {
        continue;
      }
      if (!load) {
        for (size_t i = 0; i < records.size(); ++i) {
          records[i].found = true;
          records[i].path = fileIn(*place, group.libraries[i].soname);
          records[i].place = place->label;
        }
        done = true;
        break;
      }
      std::vector<CudaLibraryRecord> attempt = records;
      if (loadGroup(group, *place, &attempt)) {
        records = attempt;
        done = true;
        break;
      }
      const bool failedHere =
          std::any_of(attempt.begin(), attempt.end(), [](const auto& r) { return !r.error.empty(); });
      if (firstFailure.empty() && failedHere) firstFailure = attempt;
    }
    // Nothing loaded: report the first place where the group was found but did not load.
    if (!done && !firstFailure.empty()) records = firstFailure;
    search.libraries.insert(search.libraries.end(), records.begin(), records.end());
  }
  return search;
}

}  // namespace rc
