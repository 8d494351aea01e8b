#include "bench/serve_bench/workload.h"

#include <cmath>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"

namespace duet::bench {

absl::StatusOr<LengthRange> ParseLengthRange(absl::string_view spec) {
  std::vector<absl::string_view> parts = absl::StrSplit(spec, '-');
  LengthRange r;
  bool ok = false;
  if (parts.size() == 1) {
    ok = absl::SimpleAtoi(parts[0], &r.min);
    r.max = r.min;
  } else if (parts.size() == 2) {
    ok = absl::SimpleAtoi(parts[0], &r.min) && absl::SimpleAtoi(parts[1], &r.max);
  }
  if (!ok || r.min < 1 || r.max < r.min) {
    return absl::InvalidArgumentError(
        absl::StrCat("length '", spec, "': want N or A-B with 1 <= A <= B"));
  }
  return r;
}

double Rng::Uniform01() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }

int64_t Rng::UniformInt(int64_t lo, int64_t hi) {
  if (hi <= lo) return lo;
  const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
  // Rejection sampling: no modulo bias.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % span;
  uint64_t x;
  do {
    x = engine_();
  } while (x >= limit);
  return lo + static_cast<int64_t>(x % span);
}

double PoissonArrivals::Next() {
  // Inverse transform: -ln(1 - U) / rate, with 1 - U in (0, 1].
  t_ += -std::log(1.0 - rng_.Uniform01()) / rate_;
  return t_;
}

RequestSpec SyntheticSource::Next() {
  absl::MutexLock lock(&mu_);
  RequestSpec r;
  r.cls = cls_;
  const int n = rng_.Draw(options_.input);
  r.token_ids.reserve(n);
  for (int i = 0; i < n; ++i) {
    r.token_ids.push_back(
        static_cast<int32_t>(rng_.UniformInt(options_.min_token_id, options_.max_token_id)));
  }
  r.max_tokens = rng_.Draw(options_.output);
  return r;
}

absl::StatusOr<std::vector<DatasetEntry>> LoadJsonlDataset(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("dataset ", path, ": cannot open"));
  std::vector<DatasetEntry> out;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    const std::string where = absl::StrCat("dataset ", path, " line ", line_no);
    if (j.is_discarded() || !j.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": not a JSON object"));
    }
    auto p = j.find("prompt");
    if (p == j.end() || !p->is_string() || p->get<std::string>().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": needs a non-empty \"prompt\""));
    }
    DatasetEntry e{p->get<std::string>(), 0};
    auto m = j.find("max_tokens");
    if (m != j.end()) {
      if (!m->is_number_integer() || m->get<int64_t>() < 1 || m->get<int64_t>() > (1 << 20)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": \"max_tokens\" must be a positive integer"));
      }
      e.max_tokens = m->get<int>();
    }
    out.push_back(std::move(e));
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat("dataset ", path, ": empty"));
  return out;
}

RequestSpec DatasetSource::Next() {
  absl::MutexLock lock(&mu_);
  const DatasetEntry& e = entries_[next_];
  next_ = (next_ + 1) % entries_.size();
  RequestSpec r;
  r.cls = cls_;
  r.text = e.prompt;
  r.max_tokens = e.max_tokens > 0 ? e.max_tokens : rng_.Draw(default_output_);
  return r;
}

}  // namespace duet::bench
