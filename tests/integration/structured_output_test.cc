// Structured output through real servers, as an OpenAI / vLLM client asks for it: `duet serve
// --colocated` and a 1P1D `duet serve --loopback` (the first token sampled on the prefill node,
// the rest on the decode node, each with its own compiled grammar) on the tiny synthetic model.
// Every answer matches its grammar (a choice, a regex, a JSON schema, any JSON object, streamed
// or not), the cluster answers token for token what the colocated server does, an output cut by
// max_tokens ends with finish_reason "length", and a grammar the engine cannot compile is a 400
// naming it on both.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/model/synthetic_model.h"
#include "nlohmann/json.hpp"
#include "tests/integration/http_exchange.h"
#include "tests/integration/serve_process.h"

#ifndef DUET_BIN
#error "DUET_BIN must point at the duet binary"
#endif

namespace duet {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::Exchange;
using testing::Reply;
using testing::ServeProcess;

int PortOf(const std::string& url) { return std::stoi(url.substr(url.rfind(':') + 1)); }

class StructuredOutputTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_dir_ =
        (fs::temp_directory_path() / absl::StrCat("duet_structured_test_", getpid())).string();
    ASSERT_TRUE(model::WriteSyntheticModel("tiny", 3, model_dir_).ok());
  }
  static void TearDownTestSuite() { fs::remove_all(model_dir_); }

  static std::vector<std::string> Flags(bool colocated) {
    std::vector<std::string> f = {"--model=" + model_dir_, "--threads=1",
                                  "--kv_cache_bytes=16777216", "--http_port=0"};
    if (colocated) {
      f.push_back("--colocated");
    } else {
      for (const char* x : {"--loopback", "--prefill=1", "--decode=1", "--transport=shm"}) {
        f.push_back(x);
      }
    }
    return f;
  }

  static inline std::string model_dir_;
};

struct Answer {
  int status = 0;
  std::string text;
  std::string finish_reason;
  json body;
};

Answer Complete(int port, json request) {
  request["prompt"] = "Tell me:";
  const Reply r = Exchange(port, "POST", "/v1/completions", request.dump());
  Answer a{.status = r.status};
  a.body = json::parse(r.body, nullptr, false);
  if (r.status == 200 && !a.body.is_discarded()) {
    a.text = a.body["choices"][0].value("text", "");
    a.finish_reason = a.body["choices"][0].value("finish_reason", "");
  }
  return a;
}

bool MatchesDigitsDashLetters(const std::string& s) {
  if (s.size() < 4 || s[2] != '-') return false;
  for (int i = 0; i < 2; ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
  }
  for (size_t i = 3; i < s.size(); ++i) {
    if (s[i] < 'x' || s[i] > 'z') return false;
  }
  return true;
}

TEST_F(StructuredOutputTest, EveryAnswerMatchesItsGrammarAndTheClusterAnswersAsOneProcess) {
  ServeProcess colocated(DUET_BIN, Flags(true));
  ASSERT_TRUE(colocated.ready());
  ServeProcess cluster(DUET_BIN, Flags(false));
  ASSERT_TRUE(cluster.ready());
  const int ports[2] = {PortOf(colocated.http_url()), PortOf(cluster.http_url())};

  const json schema = {
      {"type", "object"},
      {"properties", {{"id", {{"type", "integer"}}}, {"ok", {{"type", "boolean"}}}}},
      {"required", {"id", "ok"}},
      {"additionalProperties", false}};
  struct Case {
    const char* name;
    json fields;
    bool (*matches)(const std::string& text);
  } cases[] = {
      {"guided_choice",
       {{"guided_choice", {"red", "green", "blue"}}},
       [](const std::string& t) { return t == "red" || t == "green" || t == "blue"; }},
      {"structured_outputs.regex",
       {{"structured_outputs", {{"regex", "[0-9]{2}-[x-z]+"}}}},
       MatchesDigitsDashLetters},
      {"response_format json_schema",
       {{"response_format",
         {{"type", "json_schema"}, {"json_schema", {{"name", "r"}, {"schema", schema}}}}}},
       [](const std::string& t) {
         const json j = json::parse(t, nullptr, false);
         // An integer (past 64 bits it parses as a double: still a whole number).
         return !j.is_discarded() && j.is_object() && j.size() == 2 && j["id"].is_number() &&
                std::floor(j["id"].get<double>()) == j["id"].get<double>() && j["ok"].is_boolean();
       }},
      {"response_format json_object",
       {{"response_format", {{"type", "json_object"}}}},
       [](const std::string& t) {
         const json j = json::parse(t, nullptr, false);
         return !j.is_discarded() && j.is_object();
       }},
  };
  for (const Case& c : cases) {
    for (int seed = 0; seed < 3; ++seed) {
      json request = c.fields;
      request["max_tokens"] = 96;
      request["temperature"] = seed == 0 ? 0.0 : 1.0;
      request["seed"] = seed;
      Answer got[2];
      for (int s = 0; s < 2; ++s) {
        got[s] = Complete(ports[s], request);
        ASSERT_EQ(got[s].status, 200)
            << c.name << " on " << (s ? "1P1D" : "colocated") << ": " << got[s].body.dump();
        EXPECT_TRUE(c.matches(got[s].text))
            << c.name << " seed " << seed << " on " << (s ? "1P1D" : "colocated") << ": '"
            << got[s].text << "'";
        EXPECT_EQ(got[s].finish_reason, "stop") << c.name << ": " << got[s].text;
      }
      EXPECT_EQ(got[1].text, got[0].text) << c.name << " seed " << seed;
    }
  }

  // Streamed: the deltas put together are the same JSON document.
  {
    json request = {{"response_format", {{"type", "json_object"}}},
                    {"max_tokens", 96},
                    {"temperature", 1.0},
                    {"seed", 5},
                    {"stream", true},
                    {"prompt", "Tell me:"}};
    const Reply r = Exchange(ports[1], "POST", "/v1/completions", request.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    std::string text;
    for (absl::string_view line : absl::StrSplit(r.body, '\n')) {
      if (!absl::ConsumePrefix(&line, "data: ") || line == "[DONE]") continue;
      const json chunk = json::parse(line, nullptr, false);
      ASSERT_FALSE(chunk.is_discarded()) << line;
      if (!chunk["choices"].empty()) text += chunk["choices"][0].value("text", "");
    }
    const json whole = json::parse(text, nullptr, false);
    EXPECT_TRUE(!whole.is_discarded() && whole.is_object()) << text;
    request.erase("stream");
    EXPECT_EQ(Complete(ports[0], request).text, text);
  }

  for (int s = 0; s < 2; ++s) {
    // Cut before the grammar is complete: finish_reason "length", as vLLM.
    const Answer cut = Complete(
        ports[s],
        {{"response_format", {{"type", "json_schema"}, {"json_schema", {{"schema", schema}}}}},
         {"max_tokens", 3}});
    ASSERT_EQ(cut.status, 200) << cut.body.dump();
    EXPECT_EQ(cut.finish_reason, "length") << cut.text;
    EXPECT_TRUE(absl::StartsWith(cut.text, "{")) << cut.text;
    // A grammar the engine cannot compile: a 400 naming it, from the server, before any node
    // spends a prefill on it.
    const Answer bad =
        Complete(ports[s], {{"structured_outputs", {{"regex", "(unclosed"}}}, {"max_tokens", 8}});
    EXPECT_EQ(bad.status, 400) << bad.body.dump();
    EXPECT_TRUE(absl::StrContains(bad.body.dump(), "regex")) << bad.body.dump();
    const Answer bad_schema =
        Complete(ports[s], {{"guided_json", {{"type", "no-such-type"}}}, {"max_tokens", 8}});
    EXPECT_EQ(bad_schema.status, 400) << bad_schema.body.dump();
    // Still serving.
    EXPECT_EQ(Complete(ports[s], {{"guided_choice", {"a", "b"}}, {"max_tokens", 4}}).status, 200);
  }
}

}  // namespace
}  // namespace duet
