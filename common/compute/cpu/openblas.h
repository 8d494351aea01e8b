// OpenBLAS, loaded when cpu_gemm 'openblas' is first asked for (dlopen of libopenblas.so.0),
// so that a process on the batch-invariant GEMM never maps it: linked, OpenBLAS and the
// libgfortran it needs are about 2 MiB of every process's resident memory.
//
//   DUET_ASSIGN_OR_RETURN(const cpu::OpenBlas* blas, cpu::LoadOpenBlas());
//   blas->set_num_threads(2);
//   blas->sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.f, x, k, w, k, 0.f, y, n);
#pragma once

#include "absl/status/statusor.h"

#if defined(DUET_HAVE_OPENBLAS)
#include <cblas.h>
#endif

namespace duet::compute::cpu {

#if defined(DUET_HAVE_OPENBLAS)
// The entry points duet calls, typed by OpenBLAS's own header.
struct OpenBlas {
  decltype(&cblas_sgemm) sgemm = nullptr;
  decltype(&openblas_set_num_threads) set_num_threads = nullptr;
};

// Loads the library once per process (later calls return the first call's result); it stays
// loaded for the life of the process. FailedPrecondition with dlerror()'s text when neither
// libopenblas.so.0 nor libopenblas.so loads or an entry point is missing.
absl::StatusOr<const OpenBlas*> LoadOpenBlas();
#endif

}  // namespace duet::compute::cpu
