// Backend plugins: a compute backend built as a shared module (libduet_<name>_backend.so) that
// a binary loads only when the backend is asked for, so that processes computing on the CPU never
// map the backend's libraries (the CUDA plugin carries cudart, cuBLAS and cuBLASLt: about 230 MB
// of resident memory once loaded). The module registers its factory (backend_registry.h) from a
// static initializer into the loading binary, which must export its symbols (CMake: ENABLE_EXPORTS;
// duet_use_cuda_plugin(target) sets it up, with a static EnableBackendPlugin("cuda")).
// ResolveDevice (backend_registry.h) loads an enabled plugin on first use: for cuda always,
// for "auto" only where GpuDeviceNodesPresent().
//
//   std::string path;
//   DUET_RETURN_IF_ERROR(LoadBackendPlugin("cuda", &path));   // then "cuda" is registered
//   if (!GpuDeviceNodesPresent(&why)) ...                      // no NVIDIA driver here
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace duet::compute {

// Lets ResolveDevice load the plugin for `name` when it is not linked in. Returns true so
// it can initialise a static.
bool EnableBackendPlugin(const std::string& name);
bool BackendPluginEnabled(const std::string& name);
void DisableBackendPlugin(const std::string& name);  // tests

// Where LoadBackendPlugin looks for libduet_<name>_backend.so, in order: the directory of the
// running executable, its ../lib (an installed or packed tree: bin/duet, lib/...), and the
// build tree's lib/ as configured.
std::vector<std::string> BackendPluginCandidates(absl::string_view name);

// Loads the plugin once per process (later calls return the first call's result). NotFound
// naming every path tried when there is none; FailedPrecondition with dlerror()'s text when one
// exists but does not load (a missing library or symbol); Internal when it loads but registers
// no backend `name`. *path (optional) receives the module's path.
absl::Status LoadBackendPlugin(absl::string_view name, std::string* path = nullptr);

// Whether the NVIDIA driver's device nodes exist (/dev/nvidiactl, or /dev/dxg under WSL): a
// check that loads nothing. False sets *why (optional) to what is missing.
bool GpuDeviceNodesPresent(std::string* why = nullptr);

}  // namespace duet::compute
