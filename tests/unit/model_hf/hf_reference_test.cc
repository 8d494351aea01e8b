// duet against Hugging Face transformers on tiny random models of every architecture: for each
// model directory in testdata/ (written by transformers' save_pretrained; goldens made by
// scripts/make_hf_reference.py, see README.md) the first-step log-softmax over the whole
// vocabulary after each prompt is transformers' within 1e-4, and greedy decoding with the KV
// cache gives transformers' ids. The *LegacyConfig cases read the same weights with a config
// that has RoPE where transformers 4.x wrote it (top-level rope_theta / rope_scaling).
// Nothing skips: a model directory that is missing or does not load is a failure naming it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/base/status.h"
#include "common/compute/compute_backend.h"
#include "common/config/model_config.h"
#include "common/kv/block_pool.h"
#include "common/kv/block_table.h"
#include "common/model/model_runner.h"
#include "common/weights/gguf_model.h"
#include "common/weights/weights.h"
#include "nlohmann/json.hpp"

namespace duet::model {
namespace {

const std::string kData = std::string(DUET_SOURCE_DIR) + "/tests/unit/model_hf/testdata/";
constexpr double kLogprobTolerance = 1e-4;
constexpr int kBlockSize = 16;
constexpr int64_t kNumBlocks = 64;  // 1024 tokens; the longest case is 300 + 16

struct HfCase {
  std::string test_name;   // "Qwen3"
  std::string model;       // directory with model.safetensors and golden.json: "qwen3"
  std::string config_dir;  // directory with config.json: "qwen3" or "qwen3_legacy_config"
};

// gtest prints the parameter of a failed test with this.
void PrintTo(const HfCase& c, std::ostream* os) { *os << c.config_dir; }

std::vector<HfCase> Cases() {
  const std::vector<std::pair<std::string, std::string>> models = {
      {"LlamaGqa", "llama_gqa"}, {"Llama3Scaled", "llama3_scaled"}, {"Qwen2", "qwen2"},
      {"Qwen3", "qwen3"},        {"MistralSw", "mistral_sw"},       {"Gemma3", "gemma3"},
  };
  std::vector<HfCase> out;
  for (const auto& [test_name, dir] : models) out.push_back({test_name, dir, dir});
  for (const auto& [test_name, dir] : models) {
    out.push_back({test_name + "LegacyConfig", dir, dir + "_legacy_config"});
  }
  return out;
}

absl::StatusOr<ModelFiles> LoadCase(const HfCase& c) {
  if (c.config_dir == c.model) return LoadModelFiles(kData + c.model);
  ModelFiles files;
  DUET_ASSIGN_OR_RETURN(files.config,
                        ModelConfig::FromJsonFile(kData + c.config_dir + "/config.json"));
  DUET_ASSIGN_OR_RETURN(files.weights, LoadWeights(kData + c.model, files.config));
  return files;
}

// CPU backend, runner and KV pool for one model (the wiring of LocalEngine::Create, without
// a tokenizer: these models have none).
class CpuModel {
 public:
  static absl::StatusOr<std::unique_ptr<CpuModel>> Create(ModelFiles files) {
    std::unique_ptr<CpuModel> m(new CpuModel());
    DUET_ASSIGN_OR_RETURN(m->backend_, compute::CreateBackend(compute::Device::kCpu, {}));
    DUET_ASSIGN_OR_RETURN(
        m->runner_, ModelRunner::Create(files.config, std::move(files.weights), m->backend_.get()));
    DUET_ASSIGN_OR_RETURN(m->pool_,
                          kv::BlockPool::Create(m->runner_->MakeKvLayout(kBlockSize), kNumBlocks));
    return m;
  }

  // Appends `tokens` to the sequence in `table`; the logits of the last one.
  absl::StatusOr<std::vector<float>> Forward(kv::BlockTable& table, std::vector<int32_t> tokens) {
    DUET_RETURN_IF_ERROR(table.Reserve(table.num_tokens() + static_cast<int64_t>(tokens.size())));
    std::vector<SequenceInput> batch = {{.seq_id = 1,
                                         .tokens = std::move(tokens),
                                         .start_pos = static_cast<int32_t>(table.num_tokens()),
                                         .table = &table,
                                         .want_logits = true}};
    DUET_ASSIGN_OR_RETURN(ForwardOutput out,
                          runner_->Forward(absl::MakeSpan(batch), pool_->View()));
    return std::move(out.logits);
  }

  const ModelConfig& config() const { return runner_->config(); }
  kv::BlockPool* pool() { return pool_.get(); }

 private:
  CpuModel() = default;
  std::unique_ptr<compute::ComputeBackend> backend_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<kv::BlockPool> pool_;
};

std::vector<double> LogSoftmax(const std::vector<float>& logits) {
  const double max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float x : logits) sum += std::exp(x - max);
  const double lse = max + std::log(sum);
  std::vector<double> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = logits[i] - lse;
  return out;
}

// |a - b|, infinite when either is NaN (so that a NaN fails the tolerance).
double AbsError(double a, double b) {
  const double e = std::fabs(a - b);
  return std::isnan(e) ? std::numeric_limits<double>::infinity() : e;
}

// The first maximal id, as torch.argmax.
int32_t Argmax(const std::vector<float>& logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

class HfReferenceTest : public ::testing::TestWithParam<HfCase> {};

TEST_P(HfReferenceTest, MatchesTransformers) {
  const HfCase& c = GetParam();
  const std::string golden_path = kData + c.model + "/golden.json";
  std::ifstream in(golden_path);
  ASSERT_TRUE(in.good()) << c.test_name << ": " << golden_path
                         << " is missing (scripts/make_hf_reference.py writes it)";
  const nlohmann::json golden = nlohmann::json::parse(in);

  absl::StatusOr<ModelFiles> files = LoadCase(c);
  ASSERT_TRUE(files.ok()) << c.test_name << ": loading " << c.config_dir
                          << " failed: " << files.status();
  absl::StatusOr<std::unique_ptr<CpuModel>> model = CpuModel::Create(*std::move(files));
  ASSERT_TRUE(model.ok()) << c.test_name << ": building the CPU model failed: " << model.status();
  CpuModel& m = **model;
  EXPECT_EQ(m.config().architecture, golden["architecture"].get<std::string>()) << c.test_name;
  ASSERT_EQ(golden["cases"].size(), 5u) << c.test_name;

  for (const nlohmann::json& g : golden["cases"]) {
    const int prompt_len = g["prompt_len"].get<int>();
    const std::string where = c.test_name + ", prompt length " + std::to_string(prompt_len);
    const std::vector<int32_t> prompt = g["prompt"].get<std::vector<int32_t>>();
    const std::vector<double> want_first = g["first_logprobs"].get<std::vector<double>>();
    const std::vector<int32_t> want_ids = g["greedy"].get<std::vector<int32_t>>();
    const std::vector<double> want_lps = g["greedy_logprobs"].get<std::vector<double>>();
    const std::vector<double> margins = g["greedy_margins"].get<std::vector<double>>();
    ASSERT_EQ(static_cast<int>(prompt.size()), prompt_len) << where;

    kv::BlockTable table(m.pool());
    absl::StatusOr<std::vector<float>> logits = m.Forward(table, prompt);
    ASSERT_TRUE(logits.ok()) << where << ": prefill failed: " << logits.status();
    ASSERT_EQ(logits->size(), want_first.size()) << where << ": vocabulary size";

    // (a) The first-step log-softmax, every entry.
    const std::vector<double> first = LogSoftmax(*logits);
    size_t worst = 0;
    double first_err = 0;
    for (size_t i = 0; i < first.size(); ++i) {
      const double err = AbsError(first[i], want_first[i]);
      if (err > first_err) first_err = err, worst = i;
    }
    EXPECT_LE(first_err, kLogprobTolerance)
        << where << ": the first-step log-softmax differs from transformers by " << first_err
        << " at id " << worst << " (duet " << first[worst] << ", transformers " << want_first[worst]
        << ")";

    // (b) Greedy decoding with the KV cache, id for id; the chosen ids' log-softmax values too.
    double greedy_err = 0;
    int greedy_worst = 0;
    int matched = 0;
    for (size_t step = 0; step < want_ids.size(); ++step) {
      if (step > 0) {
        logits = m.Forward(table, {want_ids[step - 1]});
        ASSERT_TRUE(logits.ok()) << where << ", greedy step " << step
                                 << ": decode failed: " << logits.status();
      }
      const int32_t id = Argmax(*logits);
      if (id != want_ids[step]) {
        ADD_FAILURE() << where << ", greedy step " << step << ": duet id " << id
                      << ", transformers id " << want_ids[step] << " (transformers' top-1 margin "
                      << margins[step] << "; duet's logit of " << want_ids[step] << " is "
                      << (*logits)[want_ids[step]] << ", of " << id << " " << (*logits)[id] << ")";
        break;
      }
      const double err = AbsError(LogSoftmax(*logits)[id], want_lps[step]);
      if (err > greedy_err) greedy_err = err, greedy_worst = static_cast<int>(step);
      ++matched;
    }
    EXPECT_LE(greedy_err, kLogprobTolerance)
        << where << ": the log-softmax of greedy step " << greedy_worst << "'s id differs from "
        << "transformers by " << greedy_err;
    std::printf(
        "[ hf ] %-22s prompt %3d: max |d logprob| first step %.3g, greedy %.3g; "
        "%d/%zu greedy ids match\n",
        c.test_name.c_str(), prompt_len, first_err, greedy_err, matched, want_ids.size());
  }
}

INSTANTIATE_TEST_SUITE_P(HfReference, HfReferenceTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<HfCase>& info) {
                           return info.param.test_name;
                         });

}  // namespace
}  // namespace duet::model
