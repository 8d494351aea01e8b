#include "common/compute/backend_plugin.h"

#include <dlfcn.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/logging.h"
#include "common/compute/backend_registry.h"

namespace duet::compute {
namespace {

std::string ModuleName(absl::string_view name) {
  return absl::StrCat("libduet_", name, "_backend.so");
}

// The directory of the running executable ("" when /proc/self/exe cannot be read).
std::string ExecutableDir() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : exe.parent_path().string();
}

std::mutex& PluginMutex() {
  static std::mutex mu;
  return mu;
}

std::set<std::string>& EnabledPlugins() {
  static auto* enabled = new std::set<std::string>();
  return *enabled;
}

}  // namespace

bool EnableBackendPlugin(const std::string& name) {
  std::lock_guard<std::mutex> lock(PluginMutex());
  EnabledPlugins().insert(name);
  return true;
}

bool BackendPluginEnabled(const std::string& name) {
  std::lock_guard<std::mutex> lock(PluginMutex());
  return EnabledPlugins().count(name) > 0;
}

void DisableBackendPlugin(const std::string& name) {
  std::lock_guard<std::mutex> lock(PluginMutex());
  EnabledPlugins().erase(name);
}

std::vector<std::string> BackendPluginCandidates(absl::string_view name) {
  const std::string module = ModuleName(name);
  std::vector<std::string> out;
  if (const std::string dir = ExecutableDir(); !dir.empty()) {
    out.push_back(absl::StrCat(dir, "/", module));
    out.push_back(absl::StrCat(dir, "/../lib/", module));
  }
#ifdef DUET_BACKEND_PLUGIN_DIR
  out.push_back(absl::StrCat(DUET_BACKEND_PLUGIN_DIR, "/", module));
#endif
  return out;
}

absl::Status LoadBackendPlugin(absl::string_view name, std::string* path) {
  struct Loaded {
    absl::Status status;
    std::string path;
  };
  // A loaded module stays loaded for the life of the process (the registry holds its factory's
  // code), so its dlopen handle is never closed and not kept.
  static auto* loaded = new std::map<std::string, Loaded, std::less<>>();
  std::lock_guard<std::mutex> lock(PluginMutex());
  auto it = loaded->find(name);
  if (it == loaded->end()) {
    Loaded result;
    const std::vector<std::string> candidates = BackendPluginCandidates(name);
    for (const std::string& candidate : candidates) {
      std::error_code ec;
      if (!std::filesystem::exists(candidate, ec)) continue;
      result.path = std::filesystem::weakly_canonical(candidate, ec).string();
      if (ec) result.path = candidate;
      break;
    }
    if (result.path.empty()) {
      result.status =
          absl::NotFoundError(absl::StrCat("compute backend '", name, "': no ", ModuleName(name),
                                           " (looked in ", absl::StrJoin(candidates, ", "), ")"));
    } else if (dlopen(result.path.c_str(), RTLD_NOW | RTLD_LOCAL) == nullptr) {
      const char* err = dlerror();
      result.status = absl::FailedPreconditionError(
          absl::StrCat("compute backend '", name, "': ", result.path,
                       " does not load: ", err != nullptr ? err : "unknown dlopen error"));
    } else if (!IsBackendRegistered(std::string(name))) {
      result.status =
          absl::InternalError(absl::StrCat("compute backend '", name, "': ", result.path,
                                           " loaded but registered no backend '", name, "'"));
    } else {
      DUET_LOG(INFO) << "compute backend '" << name << "': loaded " << result.path;
    }
    it = loaded->emplace(std::string(name), std::move(result)).first;
  }
  if (path != nullptr) *path = it->second.path;
  return it->second.status;
}

bool GpuDeviceNodesPresent(std::string* why) {
  for (const char* node : {"/dev/nvidiactl", "/dev/dxg"}) {
    if (access(node, F_OK) == 0) return true;
  }
  if (why != nullptr) *why = "no NVIDIA driver device node (/dev/nvidiactl or /dev/dxg)";
  return false;
}

}  // namespace duet::compute
