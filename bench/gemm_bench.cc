// gemm_bench: GFLOP/s of the CPU backend's batch-invariant GEMM ("invariant") on each
// --cpu_isa path next to OpenBLAS cblas_sgemm ("openblas") for the model's projection shapes,
// prefill and decode M, and each path's share of the FMA peak measured first on the same
// threads (a loop of independent vector FMAs: 24 zmm chains for avx512, 12 ymm for avx2).
//
// With --formats (GGUF block types: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K .. Q6_K), the kept
// quantized weights instead: per format, path and M, the time of one product over a ring of
// copies of the matrix larger than the last-level cache (so that, as in a decode step, the
// weights come from memory), and the packed bytes read per second. --ring_mib sets the ring's
// size (default 256): a ring of one matrix (--ring_mib 0) keeps the weights in cache, which
// gives the kernel's own rate without the memory's.
//
// With --bf16_dot, bf16 weights three ways on each path: kept as bf16 and widened to float32
// before the float32 fma chain (cpu_gemm invariant), on bf16 dot products (cpu_gemm bf16), and
// the same values in float32 panels, each against its own peak: the FMA loop's for the first and
// last, a loop of independent vdpbf16ps (64 FLOP each) for the dot products on avx512_bf16.
//
//   gemm_bench [--threads N] [--min_time SECONDS] [--cpu_isa avx2,avx512] [--m 1,8,32,512]
//              [--formats Q4_0,Q3_K,...] [--ring_mib 256] [--bf16_dot] [--json FILE]
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/base/auto_option.h"
#include "common/base/float16.h"
#include "common/compute/compute_backend.h"
#include "common/compute/cpu/cpu_isa.h"
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

std::unique_ptr<ComputeBackend> MakeBackend(const std::string& gemm, int threads,
                                            const std::string& isa = "auto") {
  BackendOptions options;
  options.num_threads = threads;
  absl::StatusOr<duet::compute::CpuGemm> g = duet::compute::ParseCpuGemm(gemm);
  absl::StatusOr<std::optional<duet::compute::cpu::CpuIsa>> i =
      duet::ParseOrAuto<duet::compute::cpu::CpuIsa>(isa, duet::compute::cpu::ParseCpuIsa);
  for (const absl::Status& s : {g.status(), i.status()}) {
    if (!s.ok()) {
      std::fprintf(stderr, "gemm_bench: %s\n", std::string(s.message()).c_str());
      std::exit(2);
    }
  }
  options.cpu_gemm = *g;
  options.cpu_isa = *i;
  auto backend = duet::compute::CreateBackend(duet::compute::Device::kCpu, options);
  if (!backend.ok()) {
    std::fprintf(stderr, "gemm_bench: %s\n", std::string(backend.status().message()).c_str());
    std::exit(1);
  }
  return std::move(backend).value();
}

// FLOPs of `iters` steps of `chains` independent vector FMAs of `lanes` floats.
__attribute__((target("avx512f"))) float FmaLoopAvx512(int64_t iters) {
  __m512 acc[24];
  for (int i = 0; i < 24; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-6f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 24
    for (int i = 0; i < 24; ++i) acc[i] = _mm512_fmadd_ps(a, acc[i], b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < 24; ++i) s = _mm512_add_ps(s, acc[i]);
  float out[16];
  _mm512_storeu_ps(out, s);
  return out[0] + out[15];
}

__attribute__((target("avx2,fma"))) float FmaLoopAvx2(int64_t iters) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-6f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(a, acc[i], b);
  }
  float out[8];
  __m256 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
  _mm256_storeu_ps(out, s);
  return out[0] + out[7];
}

// 24 independent chains of vdpbf16ps: 32 products and 32 sums per instruction.
__attribute__((target("avx512f,avx512bf16"))) float DotLoopAvx512Bf16(int64_t iters) {
  __m512 acc[24];
  for (int i = 0; i < 24; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512i one = _mm512_set1_epi32(0x3F803F80);   // bf16 1.0 twice
  const __m512i tiny = _mm512_set1_epi32(0x2F802F80);  // bf16 2^-32 twice
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 24
    for (int i = 0; i < 24; ++i) {
      acc[i] = _mm512_dpbf16_ps(acc[i], reinterpret_cast<const __m512bh&>(one),
                                reinterpret_cast<const __m512bh&>(tiny));
    }
  }
  __m512 s = acc[0];
  for (int i = 1; i < 24; ++i) s = _mm512_add_ps(s, acc[i]);
  float out[16];
  _mm512_storeu_ps(out, s);
  return out[0] + out[15];
}

// GFLOP/s of the FMA loop of `isa` ("avx512" or "avx2"), or of the vdpbf16ps loop ("bf16dot"),
// on `threads` threads at once (best of 3).
double MeasurePeak(const std::string& isa, int threads) {
  const bool dot = isa == "bf16dot";
  const bool wide = dot || isa.rfind("avx512", 0) == 0;
  const int64_t iters = 20'000'000;
  const double flops_per_thread = 2.0 * iters * (dot ? 24 * 32 : wide ? 24 * 16 : 12 * 8);
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<std::thread> pool;
    std::vector<float> sink(threads);
    const double start = SecondsNow();
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        sink[t] = dot ? DotLoopAvx512Bf16(iters) : wide ? FmaLoopAvx512(iters) : FmaLoopAvx2(iters);
      });
    }
    for (std::thread& th : pool) th.join();
    const double elapsed = SecondsNow() - start;
    if (sink[0] == 12345.f) std::fprintf(stderr, "gemm_bench: unlikely sum\n");
    best = std::max(best, flops_per_thread * threads / elapsed / 1e9);
  }
  return best;
}

// GGUF blocks of random codes and integer scales for `format`, with every half (d, m, dmin)
// set to a small normal value: n rows of k / block elements blocks.
std::vector<uint8_t> RandomGgufBlocks(duet::compute::WeightFormat format, int n, int k,
                                      std::mt19937& rng) {
  using duet::compute::WeightFormat;
  const bool k_quant = format == WeightFormat::kQ2_K || format == WeightFormat::kQ3_K ||
                       format == WeightFormat::kQ4_K || format == WeightFormat::kQ5_K ||
                       format == WeightFormat::kQ6_K;
  const int per_block = k_quant ? 256 : 32;
  const int64_t block_bytes = duet::compute::StoredMatrixBytes(format, 1, per_block);
  std::vector<int> halves;  // byte offsets of the block's halves
  switch (format) {
    case WeightFormat::kQ4_1:
    case WeightFormat::kQ5_1:
    case WeightFormat::kQ4_K:
    case WeightFormat::kQ5_K:
      halves = {0, 2};
      break;
    case WeightFormat::kQ6_K:
      halves = {208};
      break;
    case WeightFormat::kQ2_K:
      halves = {80, 82};
      break;
    case WeightFormat::kQ3_K:
      halves = {108};
      break;
    default:
      halves = {0};
  }
  std::vector<uint8_t> out(static_cast<size_t>(n) * (k / per_block) * block_bytes);
  for (uint8_t& b : out) b = static_cast<uint8_t>(rng());
  const uint16_t small = 0x1400;  // about 0.001
  for (size_t b = 0; b < out.size(); b += block_bytes) {
    for (int h : halves) std::memcpy(out.data() + b + h, &small, 2);
  }
  return out;
}

std::vector<std::string> SplitList(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// --formats: the kept quantized weights on each path (see the top of the file).
int RunQuantized(const std::vector<std::string>& formats, const std::vector<std::string>& isas,
                 std::vector<std::unique_ptr<ComputeBackend>>& backends, const std::vector<int>& ms,
                 double min_time, int64_t ring_mib, const std::string& json_path) {
  using duet::compute::WeightFormat;
  // SmolLM2-135M's ffn_down and a 1B model's (K a multiple of every block).
  const std::vector<Shape> shapes = {{576, 1536}, {2048, 5632}};
  const int64_t ring_target = ring_mib << 20;  // by default well past the last-level cache
  std::mt19937 rng(7);
  nlohmann::json results = nlohmann::json::array();
  std::printf("gemm_bench: quantized weights, one product per call over a ring of %lld MiB\n",
              static_cast<long long>(ring_mib));
  std::printf("%6s %7s %7s %6s %14s %10s %8s %9s\n", "format", "N", "K", "M", "path", "us/call",
              "GB/s", "GFLOP/s");
  for (const std::string& name : formats) {
    std::optional<WeightFormat> format;
    for (int f = 0; f <= static_cast<int>(WeightFormat::kQ3_K); ++f) {
      if (name == duet::compute::WeightFormatName(static_cast<WeightFormat>(f))) {
        format = static_cast<WeightFormat>(f);
      }
    }
    if (!format || *format == WeightFormat::kF32 || *format == WeightFormat::kBf16 ||
        *format == WeightFormat::kF16) {
      std::fprintf(stderr, "gemm_bench: --formats: '%s' is not a GGUF block type\n", name.c_str());
      return 2;
    }
    for (const Shape& s : shapes) {
      const int max_m = *std::max_element(ms.begin(), ms.end());
      std::vector<float> x(static_cast<size_t>(max_m) * s.k);
      std::uniform_real_distribution<float> dist(-1.f, 1.f);
      for (float& v : x) v = dist(rng);
      std::vector<float> y(static_cast<size_t>(max_m) * s.n);
      for (size_t i = 0; i < isas.size(); ++i) {
        std::vector<std::unique_ptr<PreparedMatrix>> ring;
        int64_t ring_bytes = 0;
        while (ring.empty() || ring_bytes < ring_target) {
          const std::vector<uint8_t> blocks = RandomGgufBlocks(*format, s.n, s.k, rng);
          auto p = backends[i]->PrepareStoredMatrix(
              {.format = *format, .data = blocks.data(), .rows = s.n, .cols = s.k});
          if (!p.ok()) {
            std::fprintf(stderr, "gemm_bench: %s\n", std::string(p.status().message()).c_str());
            return 1;
          }
          ring_bytes += (*p)->bytes();
          ring.push_back(*std::move(p));
        }
        const int64_t matrix_bytes = ring[0]->bytes();
        for (int m : ms) {
          for (auto& w : ring) backends[i]->MatMul(x.data(), m, *w, nullptr, y.data());
          int64_t calls = 0;
          const double start = SecondsNow();
          double elapsed = 0;
          do {
            backends[i]->MatMul(x.data(), m, *ring[calls % ring.size()], nullptr, y.data());
            ++calls;
            elapsed = SecondsNow() - start;
          } while (elapsed < min_time || calls < static_cast<int64_t>(ring.size()));
          const double us = elapsed / calls * 1e6;
          const double gbs = static_cast<double>(matrix_bytes) * calls / elapsed / 1e9;
          const double gflops = 2.0 * m * s.n * static_cast<double>(s.k) * calls / elapsed / 1e9;
          std::printf("%6s %7d %7d %6d %14s %10.1f %8.1f %9.1f\n", name.c_str(), s.n, s.k, m,
                      isas[i].c_str(), us, gbs, gflops);
          std::fflush(stdout);
          results.push_back({{"format", name},
                             {"n", s.n},
                             {"k", s.k},
                             {"m", m},
                             {"path", isas[i]},
                             {"matrix_bytes", matrix_bytes},
                             {"us_per_call", us},
                             {"gbps", gbs},
                             {"gflops", gflops}});
        }
      }
    }
  }
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << nlohmann::json{{"bench", "gemm_quantized"}, {"results", results}}.dump(2) << "\n";
  }
  return 0;
}

// --bf16_dot: see the top of the file.
int RunBf16Dot(const std::vector<std::string>& isas, int threads, const std::vector<int>& ms,
               double min_time, const std::string& json_path) {
  using duet::compute::WeightFormat;
  const int peak_threads =
      threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const bool has_dot =
      duet::compute::cpu::ResolveCpuIsa(duet::compute::cpu::CpuIsa::kAvx512Bf16).ok();
  nlohmann::json peaks;
  peaks["avx512"] = MeasurePeak("avx512", peak_threads);
  peaks["avx2"] = MeasurePeak("avx2", peak_threads);
  if (has_dot) peaks["bf16dot"] = MeasurePeak("bf16dot", peak_threads);
  for (const auto& [name, gflops] : peaks.items()) {
    std::printf("measured peak %-8s: %.1f GFLOP/s on %d threads\n", name.c_str(),
                gflops.get<double>(), peak_threads);
  }
  std::printf("%7s %7s %6s %12s %12s %7s %12s %7s %12s %7s\n", "N", "K", "M", "path", "f32",
              "%peak", "bf16 widen", "%peak", "bf16 dot", "%peak");
  const std::vector<Shape> shapes = {{576, 576}, {1536, 576}, {576, 1536}, {49152, 576}};
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  nlohmann::json results = nlohmann::json::array();
  const int max_m = *std::max_element(ms.begin(), ms.end());
  for (const std::string& isa : isas) {
    auto exact = MakeBackend("invariant", threads, isa);
    auto dot = MakeBackend("bf16", threads, isa);
    const bool wide = isa.rfind("avx512", 0) == 0 || isa == "amx" || isa == "auto";
    const double fma_peak = peaks[wide ? "avx512" : "avx2"].get<double>();
    const bool native_dot = has_dot && (isa == "avx512_bf16" || isa == "amx" || isa == "auto");
    const double dot_peak = native_dot ? peaks["bf16dot"].get<double>() : fma_peak;
    for (const Shape& s : shapes) {
      std::vector<uint16_t> bits(static_cast<size_t>(s.n) * s.k);
      std::vector<float> widened(bits.size());
      for (size_t i = 0; i < bits.size(); ++i) {
        bits[i] = duet::FloatToBf16(dist(rng));
        widened[i] = duet::Bf16ToFloat(bits[i]);
      }
      const duet::compute::StoredMatrix stored{
          .format = WeightFormat::kBf16, .data = bits.data(), .rows = s.n, .cols = s.k};
      auto wf = exact->PrepareMatrix(widened.data(), s.n, s.k);
      auto wh = exact->PrepareStoredMatrix(stored);
      auto wd = dot->PrepareStoredMatrix(stored);
      if (!wf.ok() || !wh.ok() || !wd.ok()) {
        std::fprintf(stderr, "gemm_bench: preparing a %dx%d matrix failed\n", s.n, s.k);
        return 1;
      }
      std::vector<float> x(static_cast<size_t>(max_m) * s.k);
      for (float& v : x) v = dist(rng);
      std::vector<float> y(static_cast<size_t>(max_m) * s.n);
      for (int m : ms) {
        const double gf = TimeGflops(*exact, **wf, x.data(), m, y.data(), min_time);
        const double gh = TimeGflops(*exact, **wh, x.data(), m, y.data(), min_time);
        const double gd = TimeGflops(*dot, **wd, x.data(), m, y.data(), min_time);
        std::printf("%7d %7d %6d %12s %12.1f %7.2f %12.1f %7.2f %12.1f %7.2f\n", s.n, s.k, m,
                    isa.c_str(), gf, gf / fma_peak, gh, gh / fma_peak, gd, gd / dot_peak);
        std::fflush(stdout);
        results.push_back({{"n", s.n},
                           {"k", s.k},
                           {"m", m},
                           {"path", isa},
                           {"f32_gflops", gf},
                           {"bf16_widened_gflops", gh},
                           {"bf16_dot_gflops", gd},
                           {"fma_peak_gflops", fma_peak},
                           {"bf16_dot_peak_gflops", dot_peak}});
      }
    }
  }
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << nlohmann::json{{"bench", "gemm_bf16_dot"}, {"peaks_gflops", peaks}, {"results", results}}
               .dump(2)
        << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 0;
  double min_time = 0.3;
  std::string json_path;
  std::string isa_list = "avx2,avx512";
  std::string m_list = "1,8,32,128,512,2048";
  std::string format_list;
  int64_t ring_mib = 256;
  bool bf16_dot = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--threads" && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (arg == "--min_time" && i + 1 < argc) {
      min_time = std::atof(argv[++i]);
    } else if (arg == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (arg == "--cpu_isa" && i + 1 < argc) {
      isa_list = argv[++i];
    } else if (arg == "--m" && i + 1 < argc) {
      m_list = argv[++i];
    } else if (arg == "--formats" && i + 1 < argc) {
      format_list = argv[++i];
    } else if (arg == "--ring_mib" && i + 1 < argc) {
      ring_mib = std::atoll(argv[++i]);
    } else if (arg == "--bf16_dot") {
      bf16_dot = true;
    } else {
      std::fprintf(
          stderr,
          "usage: gemm_bench [--threads N] [--min_time S] [--cpu_isa avx2,avx512] "
          "[--m 1,8,512] [--formats Q4_0,Q3_K] [--ring_mib 256] [--bf16_dot] [--json FILE]\n");
      return 2;
    }
  }
  const std::vector<std::string> isas = SplitList(isa_list);
  std::vector<int> ms;
  for (const std::string& m : SplitList(m_list)) ms.push_back(std::atoi(m.c_str()));
  int max_m = 1;
  for (int m : ms) {
    if (m <= 0) {
      std::fprintf(stderr, "gemm_bench: bad --m element %d\n", m);
      return 2;
    }
    max_m = std::max(max_m, m);
  }
  std::vector<std::unique_ptr<ComputeBackend>> invariant;
  for (const std::string& isa : isas) invariant.push_back(MakeBackend("invariant", threads, isa));
  if (bf16_dot) return RunBf16Dot(isas, threads, ms, min_time, json_path);
  if (!format_list.empty()) {
    return RunQuantized(SplitList(format_list), isas, invariant, ms, min_time, ring_mib, json_path);
  }
  auto blas = MakeBackend("openblas", threads);
  const int peak_threads =
      threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // Each path's FMA peak: its vector width (the scalar path is compared with AVX2's).
  std::vector<double> peak;
  nlohmann::json peaks;
  for (const std::string& isa : isas) {
    const std::string width = isa.rfind("avx512", 0) == 0 ? "avx512" : "avx2";
    if (!peaks.contains(width)) peaks[width] = MeasurePeak(width, peak_threads);
    peak.push_back(peaks[width].get<double>());
  }

  const std::vector<Shape> shapes = {{576, 576}, {1536, 576}, {576, 1536}, {49152, 576}};

  std::mt19937 rng(42);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  nlohmann::json results = nlohmann::json::array();

  std::printf(
      "gemm_bench: threads=%d min_time=%.2fs  (GFLOP/s; %%peak of the path's FMA peak; "
      "ratio = invariant/openblas)\n",
      peak_threads, min_time);
  for (const auto& [width, gflops] : peaks.items()) {
    std::printf("measured FMA peak %-6s: %.1f GFLOP/s on %d threads\n", width.c_str(),
                gflops.get<double>(), peak_threads);
  }
  std::printf("%7s %7s %6s", "N", "K", "M");
  for (const std::string& isa : isas) std::printf(" %12s %6s %6s", isa.c_str(), "%peak", "ratio");
  std::printf(" %12s\n", "openblas");
  for (const Shape& s : shapes) {
    std::vector<float> w(static_cast<size_t>(s.n) * s.k);
    for (float& v : w) v = dist(rng);
    std::vector<float> x(static_cast<size_t>(max_m) * s.k);
    for (float& v : x) v = dist(rng);
    std::vector<float> y(static_cast<size_t>(max_m) * s.n);
    std::vector<std::unique_ptr<PreparedMatrix>> wi;
    for (auto& backend : invariant) {
      auto p = backend->PrepareMatrix(w.data(), s.n, s.k);
      if (!p.ok()) {
        std::fprintf(stderr, "gemm_bench: PrepareMatrix failed\n");
        return 1;
      }
      wi.push_back(*std::move(p));
    }
    auto wb = blas->PrepareMatrix(w.data(), s.n, s.k);
    if (!wb.ok()) {
      std::fprintf(stderr, "gemm_bench: PrepareMatrix failed\n");
      return 1;
    }
    for (int m : ms) {
      const double gb = TimeGflops(*blas, **wb, x.data(), m, y.data(), min_time);
      std::printf("%7d %7d %6d", s.n, s.k, m);
      nlohmann::json row{{"n", s.n}, {"k", s.k}, {"m", m}, {"openblas_gflops", gb}};
      for (size_t i = 0; i < isas.size(); ++i) {
        const double gi = TimeGflops(*invariant[i], *wi[i], x.data(), m, y.data(), min_time);
        std::printf(" %12.1f %6.2f %6.2f", gi, gi / peak[i], gi / gb);
        row[isas[i] + "_gflops"] = gi;
        row[isas[i] + "_of_peak"] = gi / peak[i];
      }
      std::printf(" %12.1f\n", gb);
      std::fflush(stdout);
      results.push_back(row);
    }
  }
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << nlohmann::json{{"bench", "gemm"},
                          {"threads", peak_threads},
                          {"fma_peak_gflops", peaks},
                          {"results", results}}
               .dump(2)
        << "\n";
  }
  return 0;
}
