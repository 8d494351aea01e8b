#include "common/compute/cpu/openblas.h"

#if defined(DUET_HAVE_OPENBLAS)

#include <dlfcn.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"

namespace duet::compute::cpu {
namespace {

absl::StatusOr<OpenBlas> Open() {
  std::string errors;
  // The runtime name first (what the library package installs), then the development link.
  for (const char* name : {"libopenblas.so.0", "libopenblas.so"}) {
    // Never closed: OpenBLAS's worker threads run its code until the process exits.
    void* handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* err = dlerror();
      absl::StrAppend(&errors, errors.empty() ? "" : "; ", err != nullptr ? err : name);
      continue;
    }
    OpenBlas blas;
    blas.sgemm = reinterpret_cast<decltype(blas.sgemm)>(dlsym(handle, "cblas_sgemm"));
    blas.set_num_threads =
        reinterpret_cast<decltype(blas.set_num_threads)>(dlsym(handle, "openblas_set_num_threads"));
    if (blas.sgemm == nullptr || blas.set_num_threads == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("cpu_gemm 'openblas': ", name, " lacks ",
                       blas.sgemm == nullptr ? "cblas_sgemm" : "openblas_set_num_threads"));
    }
    DUET_LOG(INFO) << "cpu_gemm 'openblas': loaded " << name;
    return blas;
  }
  return absl::FailedPreconditionError(
      absl::StrCat("cpu_gemm 'openblas': OpenBLAS does not load (", errors,
                   "); install libopenblas0 or use cpu_gemm 'invariant'"));
}

}  // namespace

absl::StatusOr<const OpenBlas*> LoadOpenBlas() {
  static const absl::StatusOr<OpenBlas>* loaded = new absl::StatusOr<OpenBlas>(Open());
  if (!loaded->ok()) return loaded->status();
  return &**loaded;
}

}  // namespace duet::compute::cpu

#endif  // DUET_HAVE_OPENBLAS
