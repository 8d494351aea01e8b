// Whole-model parity of the CUDA backend with the CPU backend on small synthetic Llama models
// (label gpu; skipped with a message without a GPU), plus the --device=auto|cpu|cuda choice of
// a binary that links the CUDA backend (these run, and pass, with or without a GPU).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/compute/backend_registry.h"
#include "common/compute/cuda/cuda_backend.h"
#include "common/kv/block_pool.h"
#include "common/kv/block_table.h"
#include "common/model/model_runner.h"
#include "common/model/synthetic_model.h"
#include "common/weights/weights.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/model/runner_test_util.h"

namespace duet::model {
namespace {

namespace fs = std::filesystem;
using compute::gpu_testing::RelErr;
using testing::ReserveFor;

bool GpuUsable() {
  auto n = compute::cuda::CudaDeviceCount();
  return n.ok() && *n > 0;
}

TEST(CudaDeviceChoiceTest, AutoPicksCudaExactlyWhenAGpuIsUsable) {
  ASSERT_TRUE(compute::IsBackendRegistered("cuda")) << "this binary links the CUDA backend";
  std::string why;
  auto picked = compute::ResolveDevice(std::nullopt, &why);
  ASSERT_TRUE(picked.ok()) << picked.status();
  EXPECT_EQ(*picked, GpuUsable() ? compute::Device::kCuda : compute::Device::kCpu) << why;
  EXPECT_FALSE(why.empty());
  auto backend = compute::CreateBackend(std::nullopt, {});
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->name(), compute::DeviceName(*picked));
}

TEST(CudaDeviceChoiceTest, CudaWithoutGpuIsAClearError) {
  auto backend = compute::CreateBackend(compute::Device::kCuda, {});
  if (GpuUsable()) {
    ASSERT_TRUE(backend.ok()) << backend.status();
    EXPECT_EQ((*backend)->name(), "cuda");
    return;
  }
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(backend.status().message().find("no GPU is usable"), absl::string_view::npos)
      << backend.status();
}

// A runner on `backend` with its KV pool in that backend's memory.
struct Engine {
  std::unique_ptr<compute::ComputeBackend> backend;
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<compute::KvMemory> region;  // the pool's memory (device memory on cuda)
  std::unique_ptr<kv::BlockPool> pool;
};

void MakePool(Engine& e, int64_t blocks) {
  const kv::KvLayout layout = e.runner->MakeKvLayout(16);
  auto region = e.backend->AllocateKvMemory(layout.RegionBytes(blocks));
  ASSERT_TRUE(region.ok()) << region.status();
  e.region = std::move(region).value();
  auto pool = kv::BlockPool::CreateOver(layout, blocks, e.region->data(), e.region->bytes());
  ASSERT_TRUE(pool.ok()) << pool.status();
  e.pool = std::move(pool).value();
}

Engine MakeEngine(compute::Device device, const std::string& gemm_dtype,
                  const SyntheticOverrides& o, const std::string& prefill = "simt") {
  static int counter = 0;
  const fs::path dir = fs::temp_directory_path() / ("duet_gpu_model_" + std::to_string(getpid()) +
                                                    "_" + std::to_string(counter++));
  Engine e;
  EXPECT_TRUE(WriteSyntheticModel("tiny", 5, dir.string(), o).ok());
  auto config = ModelConfig::FromJsonFile((dir / "config.json").string());
  EXPECT_TRUE(config.ok()) << config.status();
  auto weights = LoadWeights(dir.string(), *config);
  EXPECT_TRUE(weights.ok()) << weights.status();
  fs::remove_all(dir);
  auto backend = compute::CreateBackend(
      device, {.num_threads = 2,
               .cuda_gemm_dtype = compute::ParseCudaGemmDtype(gemm_dtype).value(),
               .cuda_prefill_attention = compute::ParseCudaPrefillAttention(prefill).value()});
  EXPECT_TRUE(backend.ok()) << backend.status();
  e.backend = std::move(backend).value();
  auto runner = ModelRunner::Create(*config, std::move(*weights), e.backend.get());
  EXPECT_TRUE(runner.ok()) << runner.status();
  e.runner = std::move(runner).value();
  MakePool(e, 512);
  return e;
}

struct Trace {
  std::vector<std::vector<int32_t>> tokens;  // per sequence: greedy continuation
  std::vector<std::vector<float>> first_logits;  // per sequence: logits after the prompt
};

int32_t Argmax(const float* row, int vocab) { return int32_t(std::max_element(row, row + vocab) - row); }

// Prefills every prompt in one batch, then decodes them together for `steps` greedy steps.
Trace RunGreedy(Engine& e, const std::vector<std::vector<int32_t>>& prompts, int steps) {
  Trace t;
  std::vector<std::unique_ptr<kv::BlockTable>> tables;
  std::vector<SequenceInput> batch;
  for (size_t i = 0; i < prompts.size(); ++i) {
    tables.push_back(std::make_unique<kv::BlockTable>(e.pool.get()));
    batch.push_back({.seq_id = int64_t(i), .tokens = prompts[i], .start_pos = 0,
                     .table = tables.back().get(), .want_logits = true});
  }
  t.tokens.resize(prompts.size());
  for (int step = 0; step <= steps; ++step) {
    const absl::Status room = ReserveFor(batch);
    EXPECT_TRUE(room.ok()) << room;
    if (!room.ok()) return t;
    auto out = e.runner->Forward(absl::MakeSpan(batch), e.pool->View());
    EXPECT_TRUE(out.ok()) << out.status();
    if (!out.ok()) return t;
    for (size_t i = 0; i < prompts.size(); ++i) {
      if (step == 0) t.first_logits.emplace_back(out->Row(i), out->Row(i) + out->vocab);
      const int32_t next = Argmax(out->Row(i), out->vocab);
      t.tokens[i].push_back(next);
      batch[i].start_pos += int32_t(batch[i].tokens.size());
      batch[i].tokens = {next};
    }
  }
  return t;
}

std::vector<std::vector<int32_t>> Prompts(int vocab) {
  std::vector<std::vector<int32_t>> p;
  for (int len : {1, 7, 45, 130}) {
    std::vector<int32_t> t(len);
    for (int i = 0; i < len; ++i) t[i] = (i * 53 + len * 17 + 3) % vocab;
    p.push_back(t);
  }
  return p;
}

struct ModelCase {
  const char* name;
  SyntheticOverrides o;
};

class CudaModelParityTest : public ::testing::TestWithParam<ModelCase> {};

TEST_P(CudaModelParityTest, Fp32GreedyTokensEqualCpu) {
  if (!GpuUsable()) GTEST_SKIP() << "no usable GPU";
  Engine cpu = MakeEngine(compute::Device::kCpu, "f32", GetParam().o);
  Engine gpu = MakeEngine(compute::Device::kCuda, "f32", GetParam().o);
  const auto prompts = Prompts(cpu.runner->config().vocab_size);
  const Trace want = RunGreedy(cpu, prompts, 24);
  const Trace got = RunGreedy(gpu, prompts, 24);
  ASSERT_EQ(got.tokens.size(), want.tokens.size());
  for (size_t i = 0; i < want.tokens.size(); ++i) {
    EXPECT_EQ(got.tokens[i], want.tokens[i]) << "sequence " << i;
    EXPECT_LT(RelErr(got.first_logits[i], want.first_logits[i]), 1e-4) << "sequence " << i;
  }
  EXPECT_TRUE(gpu.backend->status().ok()) << gpu.backend->status();
}

TEST_P(CudaModelParityTest, Bf16LogitsWithinTolerance) {
  if (!GpuUsable()) GTEST_SKIP() << "no usable GPU";
  Engine cpu = MakeEngine(compute::Device::kCpu, "f32", GetParam().o);
  Engine gpu = MakeEngine(compute::Device::kCuda, "bf16", GetParam().o);
  const auto prompts = Prompts(cpu.runner->config().vocab_size);
  const Trace want = RunGreedy(cpu, prompts, 0);
  const Trace got = RunGreedy(gpu, prompts, 0);
  ASSERT_EQ(got.first_logits.size(), want.first_logits.size());
  for (size_t i = 0; i < want.first_logits.size(); ++i) {
    EXPECT_LT(RelErr(got.first_logits[i], want.first_logits[i]), 3e-2) << "sequence " << i;
  }
}

TEST_P(CudaModelParityTest, Bf16TensorPrefillLogitsWithinTolerance) {
  if (!GpuUsable()) GTEST_SKIP() << "no usable GPU";
  Engine cpu = MakeEngine(compute::Device::kCpu, "f32", GetParam().o);
  Engine gpu = MakeEngine(compute::Device::kCuda, "bf16", GetParam().o, "tensor");
  const auto prompts = Prompts(cpu.runner->config().vocab_size);
  const Trace want = RunGreedy(cpu, prompts, 0);
  const Trace got = RunGreedy(gpu, prompts, 0);
  ASSERT_EQ(got.first_logits.size(), want.first_logits.size());
  for (size_t i = 0; i < want.first_logits.size(); ++i) {
    EXPECT_LT(RelErr(got.first_logits[i], want.first_logits[i]), 4e-2) << "sequence " << i;
  }
}

// Quantized KV caches on both sides (f32 GEMMs): the CUDA write kernel quantizes as the CPU
// does, so the caches differ only where an f32-level difference in K/V moves a code across a
// rounding boundary. int8: greedy tokens equal the CPU's with int8 KV; fp8 (3 mantissa bits, so
// one moved code weighs more): first-step logits within the bf16 test's tolerance.
TEST_P(CudaModelParityTest, QuantizedKvMatchesCpuWithTheSameKvDtype) {
  if (!GpuUsable()) GTEST_SKIP() << "no usable GPU";
  for (kv::KvDtype dtype : {kv::KvDtype::kInt8, kv::KvDtype::kFp8E4M3}) {
    SCOPED_TRACE(kv::KvDtypeName(dtype));
    Engine cpu = MakeEngine(compute::Device::kCpu, "f32", GetParam().o);
    Engine gpu = MakeEngine(compute::Device::kCuda, "f32", GetParam().o);
    for (Engine* e : {&cpu, &gpu}) {
      ASSERT_TRUE(e->runner->SetKvDtype(dtype).ok());
      MakePool(*e, 512);
      ASSERT_EQ(e->pool->layout().dtype, dtype);
    }
    const auto prompts = Prompts(cpu.runner->config().vocab_size);
    const int steps = dtype == kv::KvDtype::kInt8 ? 24 : 0;
    const Trace want = RunGreedy(cpu, prompts, steps);
    const Trace got = RunGreedy(gpu, prompts, steps);
    ASSERT_EQ(got.tokens.size(), want.tokens.size());
    for (size_t i = 0; i < want.tokens.size(); ++i) {
      if (dtype == kv::KvDtype::kInt8) {
        EXPECT_EQ(got.tokens[i], want.tokens[i]) << "sequence " << i;
      }
      EXPECT_LT(RelErr(got.first_logits[i], want.first_logits[i]), 3e-2) << "sequence " << i;
    }
    EXPECT_TRUE(gpu.backend->status().ok()) << gpu.backend->status();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, CudaModelParityTest,
    ::testing::Values(
        ModelCase{"tiny", {}},
        ModelCase{"gqa_d64",
                  {.num_layers = 3,
                   .num_heads = 8,
                   .num_kv_heads = 2,
                   .head_dim = 64,
                   .hidden = 256,
                   .intermediate = 512,
                   .vocab = 1000}},
        ModelCase{"mistral_window",
                  {.num_layers = 2,
                   .num_heads = 4,
                   .num_kv_heads = 1,
                   .head_dim = 32,
                   .hidden = 128,
                   .intermediate = 256,
                   .sliding_window = 48,
                   .architecture = "MistralForCausalLM"}},
        ModelCase{"qwen2_bias", {.num_layers = 2, .architecture = "Qwen2ForCausalLM"}},
        ModelCase{"qwen3_qk_norm", {.num_layers = 2, .architecture = "Qwen3ForCausalLM"}},
        ModelCase{"gemma3_local_global",
                  {.num_layers = 6, .sliding_window = 32, .architecture = "Gemma3ForCausalLM"}}),
    [](const auto& info) { return std::string(info.param.name); });

// The device-generated random model equals the host-generated one (same seed).
// Forward with `sample` on cuda: the tokens sampled on the device are those Sample() picks
// from the same step's logits (want_logits too), except where the draw is within rounding of a
// cumulative boundary; greedy exactly. Decodes on the sampled tokens for a few steps.
TEST(CudaSamplingModelTest, DeviceSamplingInForwardMatchesSampleOfTheLogits) {
  if (!GpuUsable()) GTEST_SKIP() << "no usable GPU";
  Engine gpu = MakeEngine(compute::Device::kCuda, "f32", {});
  const int vocab = gpu.runner->config().vocab_size;
  const std::vector<SamplingParams> params = {
      {.logprobs = 4},
      {.temperature = 0.8f, .seed = 1},
      {.temperature = 1.2f, .top_k = 30, .seed = 2, .logprobs = 2},
      {.temperature = 1.f, .top_p = 0.85f, .seed = 3}};
  const auto prompts = Prompts(vocab);
  ASSERT_EQ(prompts.size(), params.size());
  std::vector<std::unique_ptr<kv::BlockTable>> tables;
  std::vector<SequenceInput> batch;
  for (size_t i = 0; i < prompts.size(); ++i) {
    tables.push_back(std::make_unique<kv::BlockTable>(gpu.pool.get()));
    batch.push_back({.seq_id = int64_t(i),
                     .tokens = prompts[i],
                     .start_pos = 0,
                     .table = tables.back().get(),
                     .want_logits = true,
                     .sample = &params[i]});
  }
  int compared = 0;
  for (int step = 0; step < 6; ++step) {
    for (SequenceInput& s : batch) s.sample_step = step;
    ASSERT_TRUE(ReserveFor(batch).ok());
    auto out = gpu.runner->Forward(absl::MakeSpan(batch), gpu.pool->View());
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->tokens.size(), batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      SCOPED_TRACE(::testing::Message() << "sequence " << i << " step " << step);
      const SampledToken want = Sample(out->Row(i), vocab, params[i], step);
      const SampledToken& got = out->tokens[i];
      ASSERT_GE(got.id, 0);
      ASSERT_LT(got.id, vocab);
      const compute::gpu_testing::Margins m =
          compute::gpu_testing::SamplingMargins(out->Row(i), vocab, ToRowSampling(params[i], step));
      if (!m.Near(compute::gpu_testing::kSamplingBoundaryTol)) {
        ++compared;
        EXPECT_EQ(got.id, want.id);
        EXPECT_NEAR(got.logprob, want.logprob, 1e-4);
      }
      ASSERT_EQ(got.top_logprobs.size(), want.top_logprobs.size());
      for (size_t k = 0; k < want.top_logprobs.size(); ++k) {
        EXPECT_EQ(got.top_logprobs[k].first, want.top_logprobs[k].first);
        EXPECT_NEAR(got.top_logprobs[k].second, want.top_logprobs[k].second, 1e-4);
      }
      batch[i].start_pos += int32_t(batch[i].tokens.size());
      batch[i].tokens = {got.id};
    }
  }
  EXPECT_GE(compared, 20);
}

TEST(CudaRandomModelTest, DeviceGeneratedWeightsMatchCpu) {
  if (!GpuUsable()) GTEST_SKIP() << "no usable GPU";
  auto config = SyntheticConfig("tiny", {.num_layers = 2, .num_heads = 8, .num_kv_heads = 2,
                                         .head_dim = 64, .hidden = 256, .intermediate = 512,
                                         .vocab = 2000});
  ASSERT_TRUE(config.ok()) << config.status();
  std::vector<Engine> engines(2);
  for (int i = 0; i < 2; ++i) {
    auto b =
        compute::CreateBackend(i == 0 ? compute::Device::kCpu : compute::Device::kCuda,
                               {.num_threads = 2, .cuda_gemm_dtype = compute::CudaGemmDtype::kF32});
    ASSERT_TRUE(b.ok()) << b.status();
    engines[i].backend = std::move(b).value();
    auto r = ModelRunner::CreateRandom(*config, 9, engines[i].backend.get());
    ASSERT_TRUE(r.ok()) << r.status();
    engines[i].runner = std::move(r).value();
    MakePool(engines[i], 64);
  }
  const auto prompts = Prompts(config->vocab_size);
  const Trace want = RunGreedy(engines[0], prompts, 4);
  const Trace got = RunGreedy(engines[1], prompts, 4);
  for (size_t i = 0; i < want.tokens.size(); ++i) {
    EXPECT_LT(RelErr(got.first_logits[i], want.first_logits[i]), 1e-4) << "sequence " << i;
    EXPECT_EQ(got.tokens[i], want.tokens[i]) << "sequence " << i;
  }
}

// The layer-done hook with per-layer CUDA events: the compute thread never synchronises; the hook
// stages each layer's blocks to pinned memory behind that layer's event, and what lands on the
// host equals the pool after the pass. Logits equal those of the synchronising hook.
TEST(CudaLayerHookTest, AsyncHookStagesEachLayerBehindItsEvent) {
  if (!GpuUsable()) GTEST_SKIP() << "no usable GPU";
  Engine e = MakeEngine(compute::Device::kCuda, "bf16", {.num_layers = 4});
  auto* cuda = static_cast<compute::cuda::CudaBackend*>(e.backend.get());
  const kv::KvLayout layout = e.pool->layout();
  std::vector<int32_t> prompt(100);
  for (int i = 0; i < 100; ++i) prompt[i] = (i * 13 + 1) % e.runner->config().vocab_size;

  auto mirror_mem = cuda->AllocateHostMirror(e.pool->region_bytes());
  ASSERT_TRUE(mirror_mem.ok()) << mirror_mem.status();
  const kv::KvCacheView mirror{layout, (*mirror_mem)->data(), e.pool->num_blocks()};
  auto run = [&](bool async, int* staged, std::vector<kv::BlockId>* blocks_out) -> std::vector<float> {
    e.runner->set_async_layer_hook(async);
    kv::BlockTable table(e.pool.get());
    std::vector<SequenceInput> b = {
        {.seq_id = 7, .tokens = prompt, .start_pos = 0, .table = &table, .want_logits = true}};
    EXPECT_TRUE(ReserveFor(b).ok());
    std::vector<std::shared_ptr<compute::WorkMarker>> copies;
    int calls = 0;
    auto hook = [&](int layer, absl::Span<const LayerSpan> spans) {
      ++calls;
      ASSERT_EQ(spans.size(), 1u);
      EXPECT_EQ(spans[0].ready != nullptr, async);
      if (!async) return;
      const std::vector<kv::BlockId>& blocks = *spans[0].blocks;
      *blocks_out = blocks;
      auto done = cuda->CopyKvToHost(e.pool->View(), layer, blocks, mirror, spans[0].ready.get());
      ASSERT_TRUE(done.ok()) << done.status();
      copies.push_back(*done);
      ++*staged;
    };
    auto out = e.runner->Forward(absl::MakeSpan(b), e.pool->View(), hook);
    EXPECT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(calls, 4);
    for (auto& c : copies) EXPECT_TRUE(c->Wait(absl::Now() + absl::Seconds(10)).ok());
    std::vector<float> logits = out.ok() ? out->logits : std::vector<float>();
    if (async) {
      for (int layer = 0; layer < 4; ++layer) {
        std::vector<uint8_t> want(layout.BlockBytes());
        for (size_t i = 0; i < blocks_out->size(); ++i) {
          cudaMemcpy(want.data(), e.pool->View().BlockPtr(layer, (*blocks_out)[i]), want.size(),
                     cudaMemcpyDeviceToHost);
          EXPECT_EQ(std::memcmp(mirror.BlockPtr(layer, (*blocks_out)[i]), want.data(), want.size()),
                    0)
              << "layer " << layer << " block " << i;
        }
      }
    }
    EXPECT_TRUE(table.Release().ok());
    return logits;
  };
  int staged = 0;
  std::vector<kv::BlockId> blocks;
  const std::vector<float> sync_logits = run(false, &staged, &blocks);
  const std::vector<float> async_logits = run(true, &staged, &blocks);
  EXPECT_EQ(staged, 4);
  EXPECT_EQ(async_logits, sync_logits);
}

// Disaggregation on one GPU through the staging path: a "prefill" engine computes the prompt with
// the async layer hook and stages each layer's blocks to pinned host memory behind that layer's
// event; a separate "decode" engine (its own backend and device pool, other block ids) receives
// the bytes into its pool and decodes greedily. Its tokens equal the colocated run's (prefill and
// decode in one engine), with bf16 weights and a bf16 KV cache.
TEST(CudaDisaggregationTest, StagedKvGivesTheColocatedTokens) {
  if (!GpuUsable()) GTEST_SKIP() << "no usable GPU";
  const SyntheticOverrides o{.num_layers = 3, .num_heads = 8, .num_kv_heads = 2, .head_dim = 64,
                             .hidden = 256, .intermediate = 512, .vocab = 1000};
  Engine p = MakeEngine(compute::Device::kCuda, "bf16", o);
  Engine d = MakeEngine(compute::Device::kCuda, "bf16", o);
  for (Engine* e : {&p, &d}) {
    ASSERT_TRUE(e->runner->SetKvDtype(kv::KvDtype::kBF16).ok());
    MakePool(*e, 64);
  }
  compute::ComputeBackend* pcuda = p.backend.get();
  compute::ComputeBackend* dcuda = d.backend.get();
  const kv::KvLayout layout = p.pool->layout();
  const int vocab = p.runner->config().vocab_size;
  std::vector<int32_t> prompt(75);
  for (int i = 0; i < 75; ++i) prompt[i] = (i * 29 + 3) % vocab;
  const int steps = 12;

  auto decode = [&](Engine& e, kv::BlockTable* table, int32_t first) {
    std::vector<int32_t> out = {first};
    for (int s = 0; s < steps; ++s) {
      std::vector<SequenceInput> b = {{.seq_id = 1, .tokens = {out.back()},
                                       .start_pos = int32_t(table->num_tokens()), .table = table,
                                       .want_logits = true}};
      EXPECT_TRUE(ReserveFor(b).ok());
      auto r = e.runner->Forward(absl::MakeSpan(b), e.pool->View());
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok()) break;
      out.push_back(Argmax(r->Row(0), r->vocab));
    }
    return out;
  };

  // Colocated: prefill and decode in one engine.
  std::vector<int32_t> colocated;
  {
    kv::BlockTable table(p.pool.get());
    std::vector<SequenceInput> b = {
        {.seq_id = 1, .tokens = prompt, .start_pos = 0, .table = &table, .want_logits = true}};
    ASSERT_TRUE(ReserveFor(b).ok());
    auto r = p.runner->Forward(absl::MakeSpan(b), p.pool->View());
    ASSERT_TRUE(r.ok()) << r.status();
    colocated = decode(p, &table, Argmax(r->Row(0), r->vocab));
    ASSERT_TRUE(table.Release().ok());
  }

  // Disaggregated: prefill on P with per-layer staging.
  p.runner->set_async_layer_hook(true);
  auto p_mirror_mem = pcuda->AllocateHostMirror(p.pool->region_bytes());
  ASSERT_TRUE(p_mirror_mem.ok()) << p_mirror_mem.status();
  const kv::KvCacheView p_mirror{layout, (*p_mirror_mem)->data(), p.pool->num_blocks()};
  std::vector<std::shared_ptr<compute::WorkMarker>> copies;
  std::vector<kv::BlockId> p_blocks;
  int32_t first = -1;
  {
    kv::BlockTable table(p.pool.get());
    std::vector<SequenceInput> b = {
        {.seq_id = 1, .tokens = prompt, .start_pos = 0, .table = &table, .want_logits = true}};
    ASSERT_TRUE(ReserveFor(b).ok());
    auto r = p.runner->Forward(
        absl::MakeSpan(b), p.pool->View(), [&](int layer, absl::Span<const LayerSpan> spans) {
          p_blocks = *spans[0].blocks;
          auto done = pcuda->CopyKvToHost(p.pool->View(), layer, p_blocks, p_mirror,
                                          spans[0].ready.get());
          ASSERT_TRUE(done.ok()) << done.status();
          copies.push_back(*done);
        });
    ASSERT_TRUE(r.ok()) << r.status();
    first = Argmax(r->Row(0), r->vocab);
    ASSERT_TRUE(table.Release().ok());
  }
  ASSERT_EQ(copies.size(), size_t(layout.num_layers));
  for (auto& c : copies) ASSERT_TRUE(c->Wait(absl::Now() + absl::Seconds(10)).ok());

  // D: other block ids (a few taken first); the staged bytes land in D's host mirror (as the
  // transport writes them), are copied mirror -> pool, then decode.
  auto taken = d.pool->Allocate(3);
  ASSERT_TRUE(taken.ok());
  kv::BlockTable table(d.pool.get());
  ASSERT_TRUE(table.Reserve(int64_t(prompt.size())).ok());
  ASSERT_EQ(table.blocks().size(), p_blocks.size());
  auto d_mirror_mem = dcuda->AllocateHostMirror(d.pool->region_bytes());
  ASSERT_TRUE(d_mirror_mem.ok()) << d_mirror_mem.status();
  const kv::KvCacheView d_mirror{layout, (*d_mirror_mem)->data(), d.pool->num_blocks()};
  std::shared_ptr<compute::WorkMarker> landed;
  for (int layer = 0; layer < layout.num_layers; ++layer) {
    for (size_t i = 0; i < p_blocks.size(); ++i) {
      std::memcpy(d_mirror.BlockPtr(layer, table.blocks()[i]), p_mirror.BlockPtr(layer, p_blocks[i]),
                  layout.BlockBytes());
    }
    auto copied = dcuda->CopyKvFromHost(d_mirror, layer, table.blocks(), d.pool->View(), nullptr);
    ASSERT_TRUE(copied.ok()) << copied.status();
    landed = *copied;
  }
  ASSERT_TRUE(landed->Wait(absl::Now() + absl::Seconds(10)).ok());
  table.Append(int64_t(prompt.size()));
  const std::vector<int32_t> disaggregated = decode(d, &table, first);
  EXPECT_EQ(disaggregated, colocated);
  EXPECT_TRUE(table.Release().ok());
  EXPECT_TRUE(d.pool->Free(*taken).ok());
}

}  // namespace
}  // namespace duet::model
