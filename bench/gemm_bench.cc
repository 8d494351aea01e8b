// gemm_bench: GFLOP/s of the CPU backend's batch-invariant GEMM ("invariant") next to
// OpenBLAS cblas_sgemm ("openblas") for the model's projection shapes, prefill and decode M.
//
//   gemm_bench [--threads N] [--min_time SECONDS] [--json FILE]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/compute/compute_backend.h"
#include "nlohmann/json.hpp"

namespace {

using duet::compute::BackendOptions;
using duet::compute::ComputeBackend;
using duet::compute::PreparedMatrix;

struct Shape {
  int n;
  int k;
};

double SecondsNow() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Median-free simple timing: one warm-up call, then calls until min_time has passed.
double TimeGflops(ComputeBackend& backend, const PreparedMatrix& w, const float* x, int m,
                  float* y, double min_time) {
  backend.MatMul(x, m, w, nullptr, y);
  int reps = 0;
  const double start = SecondsNow();
  double elapsed = 0;
  do {
    backend.MatMul(x, m, w, nullptr, y);
    ++reps;
    elapsed = SecondsNow() - start;
  } while (elapsed < min_time);
  const double flops = 2.0 * m * w.rows() * static_cast<double>(w.cols()) * reps;
  return flops / elapsed / 1e9;
}

std::unique_ptr<ComputeBackend> MakeBackend(const std::string& gemm, int threads) {
  BackendOptions options;
  options.num_threads = threads;
  options.cpu_gemm = gemm;
  auto backend = duet::compute::CreateBackend("cpu", options);
  if (!backend.ok()) {
    std::fprintf(stderr, "gemm_bench: %s\n", std::string(backend.status().message()).c_str());
    std::exit(1);
  }
  return std::move(backend).value();
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 0;
  double min_time = 0.3;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--threads" && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (arg == "--min_time" && i + 1 < argc) {
      min_time = std::atof(argv[++i]);
    } else if (arg == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else {
      std::fprintf(stderr, "usage: gemm_bench [--threads N] [--min_time S] [--json FILE]\n");
      return 2;
    }
  }
  auto invariant = MakeBackend("invariant", threads);
  auto blas = MakeBackend("openblas", threads);

  const std::vector<Shape> shapes = {{576, 576}, {1536, 576}, {576, 1536}, {49152, 576}};
  const std::vector<int> ms = {1, 8, 32, 128, 512, 2048};
  const int max_m = 2048;

  std::mt19937 rng(42);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  nlohmann::json results = nlohmann::json::array();

  std::printf("gemm_bench: threads=%d min_time=%.2fs  (GFLOP/s; ratio = invariant/openblas)\n",
              static_cast<int>(threads), min_time);
  std::printf("%7s %7s %6s %12s %12s %7s\n", "N", "K", "M", "invariant", "openblas", "ratio");
  for (const Shape& s : shapes) {
    std::vector<float> w(static_cast<size_t>(s.n) * s.k);
    for (float& v : w) v = dist(rng);
    std::vector<float> x(static_cast<size_t>(max_m) * s.k);
    for (float& v : x) v = dist(rng);
    std::vector<float> y(static_cast<size_t>(max_m) * s.n);
    auto wi = invariant->PrepareMatrix(w.data(), s.n, s.k);
    auto wb = blas->PrepareMatrix(w.data(), s.n, s.k);
    if (!wi.ok() || !wb.ok()) {
      std::fprintf(stderr, "gemm_bench: PrepareMatrix failed\n");
      return 1;
    }
    for (int m : ms) {
      const double gi = TimeGflops(*invariant, **wi, x.data(), m, y.data(), min_time);
      const double gb = TimeGflops(*blas, **wb, x.data(), m, y.data(), min_time);
      std::printf("%7d %7d %6d %12.1f %12.1f %7.2f\n", s.n, s.k, m, gi, gb, gi / gb);
      std::fflush(stdout);
      results.push_back({{"n", s.n}, {"k", s.k}, {"m", m}, {"invariant_gflops", gi},
                         {"openblas_gflops", gb}, {"ratio", gi / gb}});
    }
  }
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << nlohmann::json{{"bench", "gemm"}, {"threads", threads}, {"results", results}}.dump(2)
        << "\n";
  }
  return 0;
}
