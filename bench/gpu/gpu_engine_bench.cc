// gpu_engine_bench: prefill and decode speed of the CUDA engine on a random model of a real
// geometry (weights generated on the device: no file, no host copy), against two ceilings
// measured in the same run: the bf16 GEMM rate (cuBLAS, 8192^3) and the device memory
// bandwidth (device-to-device copy, bytes read + written). Also times the staging path of a KV
// transfer (device -> pinned host -> device).
//
//   gpu_engine_bench --preset llama3-8b --prefill 512,2048,8192 --decode_batch 1,32,128 \
//       --context 1024 --json out.json --table out.md
//
// Prefill: tokens/s of one prompt's forward pass and model FLOP/s (GEMMs + causal attention)
// as a share of the measured bf16 peak. Decode: one step over a batch whose sequences each hold
// --context cached tokens; its floor is (weight bytes + KV bytes read) / measured bandwidth.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/compute/cuda/cuda_backend.h"
#include "common/compute/cuda/cuda_check.h"
#include "common/compute/cuda/kernels.h"
#include "common/kv/block_pool.h"
#include "common/kv/block_table.h"
#include "common/model/model_runner.h"
#include "common/model/synthetic_model.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, preset, "llama3-8b", "synthetic geometry (see duet-make-model presets)");
ABSL_FLAG(int, layers, 0, "override the number of layers (0: the preset's)");
ABSL_FLAG(std::string, prefill, "512,2048,8192", "prompt lengths");
ABSL_FLAG(std::string, decode_batch, "1,32,128", "decode batch sizes");
ABSL_FLAG(int, context, 1024, "cached tokens per sequence in the decode benchmark");
ABSL_FLAG(std::string, dtype, "bf16", "weights/GEMM dtype: bf16, f16, f32");
ABSL_FLAG(std::string, kv_dtype, "bf16", "KV cache dtype: bf16, f16, f32, int8, fp8");
ABSL_FLAG(std::string, prefill_attention, "simt,tensor",
          "prefill attention kernels to time (the first also runs decode)");
ABSL_FLAG(int, reps, 5, "timed repetitions (median reported) after one warm-up");
ABSL_FLAG(double, datasheet_tflops, 989.0, "datasheet dense bf16 TFLOP/s (H100/H200 SXM)");
ABSL_FLAG(std::string, json, "", "write results as JSON to this file");
ABSL_FLAG(std::string, table, "", "write the table (markdown) to this file");

namespace {

using duet::compute::cuda::CudaBackend;
using duet::compute::cuda::DeviceBuffer;
using duet::model::ModelConfig;
using duet::model::ModelRunner;
using duet::model::SequenceInput;
using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "gpu_engine_bench: %s\n", what.c_str());
  std::exit(1);
}

template <typename T>
T OrDie(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) Die(absl::StrCat(what, ": ", v.status().ToString()));
  return std::move(v).value();
}

void OrDie(const absl::Status& st, const char* what) {
  if (!st.ok()) Die(absl::StrCat(what, ": ", st.ToString()));
}

std::vector<int> ParseList(const std::string& s) {
  std::vector<int> out;
  for (absl::string_view p : absl::StrSplit(s, ',', absl::SkipWhitespace())) {
    int v;
    if (!absl::SimpleAtoi(p, &v) || v <= 0) Die(absl::StrCat("bad list element '", p, "'"));
    out.push_back(v);
  }
  return out;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Device-to-device copy rate of a 4 GiB buffer, counting bytes read + written (GB/s, best of 5).
double MeasureHbmBandwidth(cudaStream_t s) {
  const size_t bytes = size_t{2} << 30;
  DeviceBuffer a = OrDie(DeviceBuffer::Create(bytes), "bandwidth buffer");
  DeviceBuffer b = OrDie(DeviceBuffer::Create(bytes), "bandwidth buffer");
  cudaMemsetAsync(a.get(), 1, bytes, s);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  double best = 0;
  for (int rep = 0; rep < 6; ++rep) {
    cudaEventRecord(e0, s);
    cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, s);
    cudaEventRecord(e1, s);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (rep > 0) best = std::max(best, 2.0 * bytes / (ms * 1e-3) / 1e9);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return best;
}

// cuBLAS bf16 GEMM (fp32 accumulate and output, as the engine calls it), 8192^3 on random
// data: TFLOP/s, best of 5.
double MeasureGemmPeak(CudaBackend* backend) {
  const int n = 8192;
  float* x = backend->AllocateActivations(int64_t{n} * n);
  float* y = backend->AllocateActivations(int64_t{n} * n);
  if (x == nullptr || y == nullptr) Die("peak buffers");
  backend->FillRandom(x, int64_t{n} * n, 2, 1.0f);
  // The engine converts x to bf16 before each GEMM; time the GEMM alone by converting once.
  DeviceBuffer xb = OrDie(DeviceBuffer::Create(size_t{2} * n * n), "peak input");
  duet::compute::cuda::LaunchConvertFromF32(x, xb.get(), duet::compute::cuda::ElemType::kBF16,
                                            int64_t{n} * n, backend->stream());
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) Die("cublasCreate");
  cublasSetStream(h, backend->stream());
  // xb * xb^T: the engine's call (op T on the weight, bf16 in, fp32 accumulate and out).
  const float alpha = 1.f, beta = 0.f;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  double best = 0;
  for (int rep = 0; rep < 6; ++rep) {
    cudaEventRecord(e0, backend->stream());
    const cublasStatus_t st =
        cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &alpha, xb.get(), CUDA_R_16BF, n,
                     xb.get(), CUDA_R_16BF, n, &beta, y, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) Die(absl::StrCat("peak GEMM: ", cublasGetStatusString(st)));
    cudaEventRecord(e1, backend->stream());
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (rep > 0) best = std::max(best, 2.0 * n * double(n) * n / (ms * 1e-3) / 1e12);
  }
  cublasDestroy(h);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  backend->FreeActivations(x);
  backend->FreeActivations(y);
  return best;
}

struct Geometry {
  double matmul_params = 0;  // per token through all layers (no lm_head)
  double lm_head_params = 0;
  double weight_bytes = 0;   // every matrix once, in the GEMM dtype
};

Geometry Measure(const ModelConfig& c, double elem_bytes) {
  const double h = c.hidden_size, qd = c.q_dim(), kvd = c.kv_dim(), inter = c.intermediate_size;
  Geometry g;
  g.matmul_params = c.num_hidden_layers * (h * qd * 2 + h * kvd * 2 + 3 * h * inter);
  g.lm_head_params = double(c.vocab_size) * h;
  g.weight_bytes = (g.matmul_params + g.lm_head_params) * elem_bytes;
  return g;
}

duet::kv::KvDtype ParseKv(const std::string& s) {
  return OrDie(duet::kv::ParseKvDtype(s), "--kv_dtype");
}

// Fills the whole KV region with random values of its dtype (timing on zeros can mislead).
// int8/fp8 regions get random f32 values: each scale (4-byte aligned) is then a finite float in
// [-1, 1] and the codes are random bytes (fp8's two NaN codes included; timing does not depend
// on the values).
void FillKv(CudaBackend* b, const duet::kv::BlockPool& pool) {
  using duet::compute::cuda::ElemType;
  const auto dt = pool.layout().dtype;
  const ElemType et = dt == duet::kv::KvDtype::kBF16  ? ElemType::kBF16
                      : dt == duet::kv::KvDtype::kF16 ? ElemType::kF16
                                                      : ElemType::kF32;
  const size_t elem_bytes = et == ElemType::kF32 ? 4 : 2;
  const int64_t n = int64_t(pool.region_bytes() / elem_bytes);
  duet::compute::cuda::LaunchFillUniform(pool.region(), et, n, 3, 1.0f, b->stream());
  b->Synchronize();
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  duet::model::SyntheticOverrides o;
  if (absl::GetFlag(FLAGS_layers) > 0) o.num_layers = absl::GetFlag(FLAGS_layers);
  const ModelConfig config = OrDie(duet::model::SyntheticConfig(absl::GetFlag(FLAGS_preset), o),
                                   "config");
  duet::compute::BackendOptions bo;
  bo.cuda_gemm_dtype =
      OrDie(duet::compute::ParseCudaGemmDtype(absl::GetFlag(FLAGS_dtype)), "--dtype");
  const std::vector<std::string> prefill_variants =
      absl::StrSplit(absl::GetFlag(FLAGS_prefill_attention), ',', absl::SkipWhitespace());
  if (!prefill_variants.empty()) {
    bo.cuda_prefill_attention =
        OrDie(duet::compute::ParseCudaPrefillAttention(prefill_variants[0]), "--prefill_attention");
  }
  auto backend = OrDie(CudaBackend::Create(bo), "cuda backend");
  const double elem_bytes = bo.cuda_gemm_dtype == duet::compute::CudaGemmDtype::kF32 ? 4 : 2;
  const Geometry geo = Measure(config, elem_bytes);
  std::printf(
      "device: %s\nmodel: %s, %d layers, hidden %d, heads %d/%d, head_dim %d, vocab %d, "
      "%.2f B matmul params, weights %s\n",
      backend->device_name().c_str(), absl::GetFlag(FLAGS_preset).c_str(), config.num_hidden_layers,
      config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim,
      config.vocab_size, (geo.matmul_params + geo.lm_head_params) / 1e9,
      duet::compute::CudaGemmDtypeName(bo.cuda_gemm_dtype));

  const double hbm_gbs = MeasureHbmBandwidth(backend->stream());
  const double peak_tflops = MeasureGemmPeak(backend.get());
  std::printf("measured: device copy %.0f GB/s (read + write), bf16 GEMM 8192^3 %.0f TFLOP/s\n",
              hbm_gbs, peak_tflops);

  const auto t_model = Clock::now();
  auto runner = OrDie(ModelRunner::CreateRandom(config, 1234, backend.get()), "random model");
  OrDie(runner->SetKvDtype(ParseKv(absl::GetFlag(FLAGS_kv_dtype))), "kv dtype");
  std::printf("random model on device in %.1f s\n",
              std::chrono::duration<double>(Clock::now() - t_model).count());

  const std::vector<int> prefill = ParseList(absl::GetFlag(FLAGS_prefill));
  const std::vector<int> batches = ParseList(absl::GetFlag(FLAGS_decode_batch));
  const int context = absl::GetFlag(FLAGS_context);
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  const int block_size = 16;
  const duet::kv::KvLayout layout = runner->MakeKvLayout(block_size);
  int64_t max_tokens = 0;
  for (int p : prefill) max_tokens = std::max<int64_t>(max_tokens, p + block_size);
  for (int b : batches) {
    max_tokens = std::max<int64_t>(max_tokens, int64_t{b} * (context + reps + 2 + block_size));
  }
  const int64_t num_blocks = layout.BlocksForTokens(max_tokens) + 8;
  DeviceBuffer region = OrDie(backend->AllocateKvRegion(layout.RegionBytes(num_blocks)), "KV pool");
  auto pool = OrDie(duet::kv::BlockPool::CreateOver(layout, num_blocks, region.get(),
                                                    region.bytes()),
                    "block pool");
  FillKv(backend.get(), *pool);
  std::printf("KV pool: %lld blocks of %d tokens, %s, %.1f GiB\n", (long long)num_blocks,
              block_size, duet::kv::KvDtypeName(layout.dtype), region.bytes() / double(1 << 30));

  nlohmann::json results = nlohmann::json::array();
  std::string table =
      "| phase | size | ms (median) | tokens/s | model TFLOP/s | % of measured bf16 peak | "
      "floor ms | step / floor |\n|---|---|---|---|---|---|---|---|\n";

  // ---- Prefill: one prompt per pass, for each prefill attention kernel.
  auto run_prefill = [&](ModelRunner* runner, duet::kv::BlockPool* pool, CudaBackend* backend,
                         const std::string& variant) {
  for (int len : prefill) {
    std::vector<int32_t> tokens(len);
    for (int i = 0; i < len; ++i) tokens[i] = (i * 7919 + 13) % config.vocab_size;
    std::vector<double> ms;
    for (int rep = 0; rep <= reps; ++rep) {
      duet::kv::BlockTable table(pool);
      std::vector<SequenceInput> batch = {
          {.seq_id = 1, .tokens = tokens, .start_pos = 0, .table = &table, .want_logits = true}};
      OrDie(table.Reserve(len), "reserve");
      backend->Synchronize();
      const auto t0 = Clock::now();
      OrDie(runner->Forward(absl::MakeSpan(batch), pool->View()).status(), "prefill");
      const double t = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      if (rep > 0) ms.push_back(t);
      OrDie(table.Release(), "release");
    }
    const double med = Median(ms);
    const double attn_flops = 4.0 * config.head_dim * config.num_attention_heads *
                              (double(len) * (len + 1) / 2) * config.num_hidden_layers;
    const double flops = 2.0 * geo.matmul_params * len + 2.0 * geo.lm_head_params + attn_flops;
    const double tflops = flops / (med * 1e-3) / 1e12;
    const double pct = 100.0 * tflops / peak_tflops;
    std::printf("prefill %-6s %6d tokens: %9.2f ms  %10.0f tok/s  %6.1f TFLOP/s  %5.1f%% of measured "
                "peak (%.1f%% of datasheet)  attention %.0f%% of FLOPs\n",
                variant.c_str(), len, med, len / (med * 1e-3), tflops, pct,
                100.0 * tflops / absl::GetFlag(FLAGS_datasheet_tflops), 100.0 * attn_flops / flops);
    table += absl::StrCat("| prefill (", variant, " attention) | ", len, " | ", absl::StrFormat("%.2f", med), " | ",
                          absl::StrFormat("%.0f", len / (med * 1e-3)), " | ",
                          absl::StrFormat("%.1f", tflops), " | ", absl::StrFormat("%.1f", pct),
                          " | - | - |\n");
    results.push_back({{"phase", "prefill"}, {"tokens", len}, {"ms", med}, {"ms_all", ms},
                       {"tokens_per_s", len / (med * 1e-3)}, {"model_tflops", tflops},
                       {"attention_flop_share", attn_flops / flops},
                       {"pct_measured_bf16_peak", pct},
                       {"pct_datasheet", 100.0 * tflops / absl::GetFlag(FLAGS_datasheet_tflops)},
                       {"prefill_attention", variant}});
  }
  };
  const std::vector<std::string> variants =
      absl::StrSplit(absl::GetFlag(FLAGS_prefill_attention), ',', absl::SkipWhitespace());
  if (variants.empty()) Die("--prefill_attention is empty");
  run_prefill(runner.get(), pool.get(), backend.get(), variants[0]);

  // ---- Decode: one step over `b` sequences of `context` cached tokens (contents random).
  for (int b : batches) {
    std::vector<std::unique_ptr<duet::kv::BlockTable>> tables;
    std::vector<SequenceInput> batch;
    for (int i = 0; i < b; ++i) {
      tables.push_back(std::make_unique<duet::kv::BlockTable>(pool.get()));
      OrDie(tables.back()->Reserve(context), "reserve");
      tables.back()->Append(context);  // pretend these tokens were prefilled
      batch.push_back({.seq_id = i, .tokens = {(i * 31 + 1) % config.vocab_size},
                       .start_pos = context, .table = tables.back().get(), .want_logits = true});
    }
    std::vector<double> ms;
    double kv_tokens = 0;
    for (int rep = 0; rep <= reps; ++rep) {
      for (auto& s : batch) OrDie(s.table->Reserve(s.start_pos + 1), "reserve");
      backend->Synchronize();
      const auto t0 = Clock::now();
      auto out = runner->Forward(absl::MakeSpan(batch), pool->View());
      OrDie(out.status(), "decode");
      const double t = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      if (rep > 0) {
        ms.push_back(t);
        kv_tokens += double(b) * (batch[0].start_pos + 1);
      }
      for (auto& s : batch) s.start_pos += 1;
    }
    for (auto& t : tables) OrDie(t->Release(), "release");
    const double med = Median(ms);
    const double kv_bytes = kv_tokens / ms.size() * layout.BytesForTokens(1);
    const double floor_ms = (geo.weight_bytes + kv_bytes) / (hbm_gbs * 1e9) * 1e3;
    std::printf("decode batch %4d (context %d): %8.3f ms/step  %9.0f tok/s  floor %.3f ms "
                "(weights %.2f GB + KV %.2f GB)  step/floor %.2f\n",
                b, context, med, b / (med * 1e-3), floor_ms, geo.weight_bytes / 1e9,
                kv_bytes / 1e9, med / floor_ms);
    table += absl::StrCat("| decode (context ", context, ") | batch ", b, " | ",
                          absl::StrFormat("%.3f", med), " | ",
                          absl::StrFormat("%.0f", b / (med * 1e-3)), " | - | - | ",
                          absl::StrFormat("%.3f", floor_ms), " | ",
                          absl::StrFormat("%.2f", med / floor_ms), " |\n");
    results.push_back({{"phase", "decode"}, {"batch", b}, {"context", context}, {"ms", med},
                       {"ms_all", ms}, {"tokens_per_s", b / (med * 1e-3)},
                       {"weight_bytes", geo.weight_bytes}, {"kv_bytes", kv_bytes},
                       {"floor_ms", floor_ms}, {"step_over_floor", med / floor_ms}});
  }

  // ---- The other prefill attention kernels: a second backend and the same random model.
  for (size_t vi = 1; vi < variants.size(); ++vi) {
    duet::compute::BackendOptions vo = bo;
    vo.cuda_prefill_attention =
        OrDie(duet::compute::ParseCudaPrefillAttention(variants[vi]), "--prefill_attention");
    auto vb = OrDie(CudaBackend::Create(vo), "cuda backend (prefill variant)");
    auto vr = OrDie(ModelRunner::CreateRandom(config, 1234, vb.get()), "random model (variant)");
    OrDie(vr->SetKvDtype(layout.dtype), "kv dtype");
    int64_t max_prefill = 0;
    for (int p : prefill) max_prefill = std::max<int64_t>(max_prefill, p + block_size);
    const int64_t vblocks = layout.BlocksForTokens(max_prefill) + 8;
    DeviceBuffer vregion = OrDie(vb->AllocateKvRegion(layout.RegionBytes(vblocks)), "KV pool");
    auto vpool = OrDie(duet::kv::BlockPool::CreateOver(layout, vblocks, vregion.get(),
                                                       vregion.bytes()),
                       "block pool");
    run_prefill(vr.get(), vpool.get(), vb.get(), variants[vi]);
    OrDie(vb->status(), "backend (prefill variant)");
    vr.reset();
  }

  // ---- Staging path of a KV transfer through ComputeBackend::CopyKvToHost / CopyKvFromHost
  // (what a prefill node and a decode node do per layer / per request): one layer of
  // consecutive blocks, device pool <-> pinned host mirror, about 1 MiB, one layer of a
  // 2048-token prompt, and 256 MiB.
  nlohmann::json staging = nlohmann::json::array();
  table += "\n| staged copy | bytes | D2H GB/s | H2D GB/s |\n|---|---|---|---|\n";
  const size_t layer_bytes = size_t(layout.BytesForTokens(2048) / config.num_hidden_layers);
  duet::kv::KvLayout one_layer = layout;
  one_layer.num_layers = 1;
  for (size_t want : {size_t{1} << 20, layer_bytes, size_t{256} << 20}) {
    const int64_t nblocks = std::max<int64_t>(1, int64_t(want / layout.BlockBytes()));
    const size_t bytes = one_layer.RegionBytes(nblocks);
    auto dev = OrDie(backend->AllocateKvMemory(bytes), "staging pool");
    auto host = OrDie(backend->AllocateHostMirror(bytes), "host mirror");
    const duet::kv::KvCacheView dv{one_layer, dev->data(), nblocks};
    const duet::kv::KvCacheView hv{one_layer, host->data(), nblocks};
    std::vector<duet::kv::BlockId> ids(nblocks);
    for (int64_t i = 0; i < nblocks; ++i) ids[i] = duet::kv::BlockId(i);
    double d2h = 0, h2d = 0;
    for (int rep = 0; rep < 5; ++rep) {
      backend->Synchronize();
      auto t0 = Clock::now();
      auto down = OrDie(backend->CopyKvToHost(dv, 0, ids, hv, nullptr), "CopyKvToHost");
      OrDie(down->Wait(absl::Now() + absl::Seconds(30)), "staging D2H");
      auto t1 = Clock::now();
      auto up = OrDie(backend->CopyKvFromHost(hv, 0, ids, dv, nullptr), "CopyKvFromHost");
      OrDie(up->Wait(absl::Now() + absl::Seconds(30)), "staging H2D");
      auto t2 = Clock::now();
      if (rep == 0) continue;
      d2h = std::max(d2h, bytes / std::chrono::duration<double>(t1 - t0).count() / 1e9);
      h2d = std::max(h2d, bytes / std::chrono::duration<double>(t2 - t1).count() / 1e9);
    }
    std::printf("staged copy %9zu bytes: D2H %.1f GB/s, H2D %.1f GB/s\n", bytes, d2h, h2d);
    table += absl::StrCat("| staged | ", bytes, " | ", absl::StrFormat("%.1f", d2h), " | ",
                          absl::StrFormat("%.1f", h2d), " |\n");
    staging.push_back({{"bytes", bytes}, {"d2h_gbs", d2h}, {"h2d_gbs", h2d}});
  }
  OrDie(backend->status(), "backend");

  std::printf("\n%s", table.c_str());
  nlohmann::json doc = {{"device", backend->device_name()},
                        {"preset", absl::GetFlag(FLAGS_preset)},
                        {"layers", config.num_hidden_layers},
                        {"gemm_dtype", duet::compute::CudaGemmDtypeName(bo.cuda_gemm_dtype)},
                        {"kv_dtype", duet::kv::KvDtypeName(layout.dtype)},
                        {"measured_copy_gbs", hbm_gbs},
                        {"measured_bf16_gemm_tflops", peak_tflops},
                        {"results", results},
                        {"staging", staging}};
  if (!absl::GetFlag(FLAGS_json).empty()) std::ofstream(absl::GetFlag(FLAGS_json)) << doc.dump(2) << "\n";
  if (!absl::GetFlag(FLAGS_table).empty()) std::ofstream(absl::GetFlag(FLAGS_table)) << table;
  return 0;
}
