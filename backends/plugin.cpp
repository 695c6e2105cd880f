#include "backends/plugin.h"

#include <dlfcn.h>

#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "core/config.h"

namespace meshrt::backend {
namespace {

// The folder holding the core library (this code is in it), with a trailing slash; "" when the
// loader cannot say.
std::string core_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&load_plugin), &info) == 0 || info.dli_fname == nullptr) {
    return "";
  }
  const std::string self = info.dli_fname;
  const size_t slash = self.rfind('/');
  return slash == std::string::npos ? "" : self.substr(0, slash + 1);
}

Plugin open_plugin(const char* file, const char* entry) {
  Plugin p;
  std::string candidates;
  std::string first_error;
  void* handle = nullptr;
  auto attempt = [&](const std::string& path) {
    if (handle != nullptr) return;
    candidates += (candidates.empty() ? "" : ", ") + path;
    dlerror();
    handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) {
      p.path = path;
      return;
    }
    const char* err = dlerror();
    const std::string e = err != nullptr ? err : "dlopen failed";
    // A file that exists but cannot load (a library it needs is missing) is the error to report,
    // not the later "not found" of another place.
    if (first_error.empty() || first_error.find("No such file") != std::string::npos) {
      first_error = e;
    }
  };
  if (const std::optional<std::string> dir = config::plugin_dir()) {
    std::string d = *dir;
    if (d.back() != '/') d += '/';
    attempt(d + file);
  } else {
    if (const std::string d = core_dir(); !d.empty()) attempt(d + file);
    attempt(file);  // LD_LIBRARY_PATH, the cache, the default folders
  }
  if (handle == nullptr) {
    // dlopen names the file it could not open: the plugin itself, or a library the plugin needs.
    p.path = candidates;
    p.why = first_error;
    return p;
  }
  using AbiFn = int (*)();
  auto abi = reinterpret_cast<AbiFn>(dlsym(handle, "meshrt_plugin_abi"));
  if (abi == nullptr || abi() != kPluginAbi) {
    p.why = std::string(file) + " at " + p.path + " was built against another meshrt (plugin ABI " +
            (abi == nullptr ? std::string("unknown") : std::to_string(abi())) + ", this core " +
            std::to_string(kPluginAbi) + "); use the plugin built with this libmeshrt";
    return p;
  }
  p.entry = dlsym(handle, entry);
  if (p.entry == nullptr) p.why = std::string(file) + " has no entry point " + entry;
  return p;
}

}  // namespace

bool plugin_file_absent(const Plugin& p, const char* file) {
  return p.entry == nullptr && p.why.find(std::string(file) + ": cannot open") != std::string::npos;
}

const Plugin& load_plugin(const char* file, const char* entry) {
  static std::mutex mu;
  static auto* cache = new std::map<std::string, Plugin>;  // leaked: plugins are never closed
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(file);
  if (it == cache->end()) it = cache->emplace(file, open_plugin(file, entry)).first;
  return it->second;
}

}  // namespace meshrt::backend
