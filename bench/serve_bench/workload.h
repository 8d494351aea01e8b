// What the serving benchmark sends: seeded random prompts of exact token lengths, prompts from a
// JSONL dataset ({"prompt": "...", "max_tokens": N} per line), and Poisson arrival times. The
// same seed gives the same requests and the same arrival times, so runs repeat.
//
//   DUET_ASSIGN_OR_RETURN(LengthRange in, ParseLengthRange("512-1024"));
//   SyntheticSource src({.input = in, .output = {64, 64}}, /*seed=*/1, "long");
//   RequestSpec r = src.Next();          // r.token_ids.size() in [512, 1024], r.max_tokens 64
//   PoissonArrivals arrivals(/*rate_per_s=*/2.0, /*seed=*/1);
//   double t = arrivals.Next();          // seconds since the start of the run
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace duet::bench {

// A length drawn uniformly from [min, max] (inclusive); min == max for a fixed length.
struct LengthRange {
  int min = 0;
  int max = 0;
};

// "N" or "A-B" (1 <= A <= B).
absl::StatusOr<LengthRange> ParseLengthRange(absl::string_view spec);

// Deterministic random numbers: std::mt19937_64 (fully specified by the standard) with our own
// conversions, so a seed gives the same stream with every standard library.
class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  double Uniform01();                          // [0, 1)
  int64_t UniformInt(int64_t lo, int64_t hi);  // [lo, hi]
  int Draw(const LengthRange& r) { return static_cast<int>(UniformInt(r.min, r.max)); }

 private:
  std::mt19937_64 engine_;
};

// Arrival times of a Poisson process: exponential gaps with mean 1/rate.
class PoissonArrivals {
 public:
  PoissonArrivals(double rate_per_s, uint64_t seed) : rate_(rate_per_s), rng_(seed) {}
  double Next();  // seconds since the start; increasing

 private:
  double rate_;
  Rng rng_;
  double t_ = 0;
};

// One request to send.
struct RequestSpec {
  std::string cls;                 // workload class ("main", "background", "warmup")
  std::vector<int32_t> token_ids;  // the prompt as token ids (exact length) ...
  std::string text;                // ... or as text (dataset prompts)
  int max_tokens = 0;
  // Prefix-caching workloads (prefix_workloads.h); -1 / 0 elsewhere.
  int prefix_group = -1;  // shared_prefix: which of the fixed prefixes
  int session = -1;       // multi_turn: the chat session ...
  int turn = -1;          // ... and the turn index, 0 first
  int new_tokens = 0;     // prompt tokens not sent (or generated) in the session's last turn
};

// A thread-safe, endless, deterministic sequence of requests.
class RequestSource {
 public:
  virtual ~RequestSource() = default;
  virtual RequestSpec Next() = 0;
};

struct SyntheticOptions {
  LengthRange input{128, 128};
  LengthRange output{32, 32};
  int32_t min_token_id = 17;   // prompt ids are drawn from [min_token_id, max_token_id]: above
  int32_t max_token_id = 255;  // the special tokens of both the byte tokenizer and SmolLM2
};

class SyntheticSource : public RequestSource {
 public:
  SyntheticSource(const SyntheticOptions& options, uint64_t seed, std::string cls)
      : options_(options), rng_(seed), cls_(std::move(cls)) {}
  RequestSpec Next() override;

 private:
  const SyntheticOptions options_;
  absl::Mutex mu_;
  Rng rng_ ABSL_GUARDED_BY(mu_);
  const std::string cls_;
};

struct DatasetEntry {
  std::string prompt;
  int max_tokens = 0;  // 0: not given in the file
};

// Reads {"prompt": "...", "max_tokens": N} lines (max_tokens optional; blank lines skipped).
// Errors name the file and line.
absl::StatusOr<std::vector<DatasetEntry>> LoadJsonlDataset(const std::string& path);

// Dataset prompts in file order, cycling; entries without max_tokens get `default_output`.
class DatasetSource : public RequestSource {
 public:
  DatasetSource(std::vector<DatasetEntry> entries, LengthRange default_output, uint64_t seed,
                std::string cls)
      : entries_(std::move(entries)),
        default_output_(default_output),
        rng_(seed),
        cls_(std::move(cls)) {}
  RequestSpec Next() override;

 private:
  const std::vector<DatasetEntry> entries_;
  const LengthRange default_output_;
  absl::Mutex mu_;
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
  Rng rng_ ABSL_GUARDED_BY(mu_);
  const std::string cls_;
};

}  // namespace duet::bench
