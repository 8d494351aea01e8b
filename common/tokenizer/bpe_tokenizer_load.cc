// BpeTokenizer loaders: GGUF tokenizer.ggml.* keys and HF tokenizer.json (+ tokenizer_config.json).
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/base/json_util.h"
#include "common/base/status.h"
#include "common/tokenizer/bpe_tokenizer.h"
#include "nlohmann/json.hpp"

namespace duet::model {
namespace {

absl::StatusOr<std::pair<std::string, std::string>> SplitMerge(const std::string& m, size_t k,
                                                               const std::string& src) {
  const size_t sp = m.find(' ', 1);
  if (sp == std::string::npos || sp + 1 >= m.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(src, ": merge #", k, " '", m, "' is not two tokens separated by a space"));
  }
  return std::make_pair(m.substr(0, sp), m.substr(sp + 1));
}

// "<|im_end|>" or {"content": "<|im_end|>", ...}; empty when absent or null.
absl::StatusOr<std::string> TokenString(const nlohmann::json& tc, const std::string& key,
                                        const std::string& src) {
  auto it = tc.find(key);
  if (it == tc.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return absl::InvalidArgumentError(src + ": field '" + key +
                                    "': expected a string or an object with 'content', got " +
                                    JsonTypeName(*it));
}

// Which of our pre-tokenizers a tokenizer.json pre_tokenizer is; Unimplemented otherwise.
absl::StatusOr<PreTokenizerKind> DetectPreTokenizer(const nlohmann::json& pt, bool* prefix_space,
                                                    const std::string& src) {
  auto unsupported = [&]() {
    return absl::UnimplementedError(
        src + ": pre_tokenizer " + pt.dump().substr(0, 300) +
        " is not supported; supported: ByteLevel (GPT-2 regex), Sequence[Digits(individual), "
        "ByteLevel] (SmolLM), Sequence[Split(Llama-3 or Qwen2 regex), ByteLevel(use_regex=false)]");
  };
  auto is_type = [](const nlohmann::json& j, const char* t) {
    return j.is_object() && j.value("type", std::string()) == t;
  };
  auto byte_level = [&](const nlohmann::json& j, bool want_regex) {
    if (!is_type(j, "ByteLevel")) return false;
    *prefix_space = j.value("add_prefix_space", false);
    return j.value("use_regex", true) == want_regex;
  };
  if (byte_level(pt, true)) return PreTokenizerKind::kGpt2;
  if (!is_type(pt, "Sequence") || !pt.contains("pretokenizers") ||
      !pt["pretokenizers"].is_array() || pt["pretokenizers"].size() != 2) {
    return unsupported();
  }
  const nlohmann::json& a = pt["pretokenizers"][0];
  const nlohmann::json& b = pt["pretokenizers"][1];
  if (is_type(a, "Digits") && a.value("individual_digits", false) && byte_level(b, true)) {
    return PreTokenizerKind::kSmolLm;
  }
  if (is_type(a, "Split") && byte_level(b, false) && a.contains("pattern") &&
      a["pattern"].is_object() && a["pattern"].contains("Regex") &&
      a["pattern"]["Regex"].is_string()) {
    const std::string re = a["pattern"]["Regex"].get<std::string>();
    const std::string tail = "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    const std::string head = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|";
    if (re == head + "\\p{N}{1,3}" + tail) return PreTokenizerKind::kLlama3;
    if (re == head + "\\p{N}" + tail) return PreTokenizerKind::kQwen2;
  }
  return unsupported();
}

}  // namespace

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::FromGguf(const GgufFile& g) {
  BpeSpec spec;
  spec.source = g.path();
  DUET_ASSIGN_OR_RETURN(std::string model, g.GetString("tokenizer.ggml.model"));
  if (model != "gpt2") {
    return absl::UnimplementedError(g.path() + ": tokenizer.ggml.model '" + model +
                                    "' is not supported; supported: gpt2 (byte-level BPE)");
  }
  DUET_ASSIGN_OR_RETURN(spec.tokens, g.GetStringArray("tokenizer.ggml.tokens"));
  spec.kinds.assign(spec.tokens.size(), TokenKind::kNormal);
  if (g.Find("tokenizer.ggml.token_type")) {
    DUET_ASSIGN_OR_RETURN(std::vector<int64_t> types, g.GetIntArray("tokenizer.ggml.token_type"));
    if (types.size() != spec.tokens.size()) {
      return absl::InvalidArgumentError(absl::StrCat(g.path(), ": tokenizer.ggml.token_type has ",
                                                     types.size(), " entries; expected ",
                                                     spec.tokens.size(), " (one per token)"));
    }
    for (size_t i = 0; i < types.size(); ++i) {
      // llama.cpp token types: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
      if (types[i] == 3) spec.kinds[i] = TokenKind::kControl;
      if (types[i] == 4) spec.kinds[i] = TokenKind::kUserDefined;
    }
  }
  DUET_ASSIGN_OR_RETURN(std::vector<std::string> merges, g.GetStringArray("tokenizer.ggml.merges"));
  spec.merges.reserve(merges.size());
  for (size_t k = 0; k < merges.size(); ++k) {
    DUET_ASSIGN_OR_RETURN(auto m, SplitMerge(merges[k], k, g.path() + ": tokenizer.ggml.merges"));
    spec.merges.push_back(std::move(m));
  }
  DUET_ASSIGN_OR_RETURN(std::optional<std::string> pre, g.GetOptionalString("tokenizer.ggml.pre"));
  const std::string pre_name = pre.value_or("default");
  std::optional<PreTokenizerKind> kind = PreTokenizerFromGgufName(pre_name);
  if (!kind) {
    return absl::UnimplementedError(
        g.path() + ": tokenizer.ggml.pre '" + pre_name +
        "' is not supported; supported: default, gpt2, smollm, starcoder, llama-bpe, qwen2");
  }
  spec.pre = *kind;
  spec.ignore_merges = spec.pre == PreTokenizerKind::kLlama3;  // as llama.cpp does for llama-bpe
  auto get_bool = [&](const char* key, bool fallback) -> absl::StatusOr<bool> {
    if (!g.Find(key)) return fallback;
    return g.GetBool(key);
  };
  DUET_ASSIGN_OR_RETURN(spec.add_bos, get_bool("tokenizer.ggml.add_bos_token", false));
  DUET_ASSIGN_OR_RETURN(spec.add_prefix_space, get_bool("tokenizer.ggml.add_space_prefix", false));
  auto get_id = [&](const char* key) -> absl::StatusOr<int32_t> {
    DUET_ASSIGN_OR_RETURN(std::optional<int64_t> v, g.GetOptionalInt(key));
    if (!v) return -1;
    if (*v < 0 || *v >= static_cast<int64_t>(spec.tokens.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          g.path(), ": ", key, " ", *v, " is outside the vocabulary of ", spec.tokens.size()));
    }
    return static_cast<int32_t>(*v);
  };
  DUET_ASSIGN_OR_RETURN(spec.bos_id, get_id("tokenizer.ggml.bos_token_id"));
  DUET_ASSIGN_OR_RETURN(int32_t eos, get_id("tokenizer.ggml.eos_token_id"));
  DUET_ASSIGN_OR_RETURN(int32_t eot, get_id("tokenizer.ggml.eot_token_id"));
  if (eos >= 0) spec.eos_ids.push_back(eos);
  if (eot >= 0 && eot != eos) spec.eos_ids.push_back(eot);
  DUET_ASSIGN_OR_RETURN(std::optional<std::string> tmpl,
                        g.GetOptionalString("tokenizer.chat_template"));
  spec.chat_template = tmpl.value_or("");
  return Create(std::move(spec));
}

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::FromTokenizerJson(
    const std::string& path) {
  DUET_ASSIGN_OR_RETURN(nlohmann::json tj, ReadJsonFile(path));
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(path + ": " + what);
  };
  if (!tj.is_object() || !tj.contains("model") || !tj["model"].is_object()) {
    return bad("expected an object with a 'model' object");
  }
  const nlohmann::json& m = tj["model"];
  const std::string type = m.value("type", std::string());
  if (type != "BPE") {
    return absl::UnimplementedError(path + ": model.type '" + type +
                                    "' is not supported; supported: BPE (byte-level)");
  }
  if (m.value("byte_fallback", false)) {
    return absl::UnimplementedError(path +
                                    ": model.byte_fallback (SentencePiece-style BPE) is "
                                    "not supported; only byte-level BPE");
  }
  if (tj.contains("normalizer") && !tj["normalizer"].is_null()) {
    return absl::UnimplementedError(path + ": normalizer " +
                                    tj["normalizer"].dump().substr(0, 200) +
                                    " is not supported (only none)");
  }
  if (!m.contains("vocab") || !m["vocab"].is_object())
    return bad("model.vocab: expected an object");
  BpeSpec spec;
  spec.source = path;
  spec.ignore_merges = m.value("ignore_merges", false);
  auto place = [&](int64_t id, const std::string& text, TokenKind kind) -> absl::Status {
    if (id < 0 || id >= (int64_t{1} << 24)) {
      return bad(absl::StrCat("token '", text, "' has id ", id, "; expected 0..2^24"));
    }
    if (static_cast<size_t>(id) >= spec.tokens.size()) {
      spec.tokens.resize(id + 1);
      spec.kinds.resize(id + 1, TokenKind::kNormal);
    }
    spec.tokens[id] = text;
    spec.kinds[id] = kind;
    return absl::OkStatus();
  };
  for (const auto& [text, id] : m["vocab"].items()) {
    if (!id.is_number_integer()) return bad("model.vocab['" + text + "']: expected an integer id");
    DUET_RETURN_IF_ERROR(place(id.get<int64_t>(), text, TokenKind::kNormal));
  }
  if (tj.contains("added_tokens") && tj["added_tokens"].is_array()) {
    for (const nlohmann::json& a : tj["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
          !a.contains("content") || !a["content"].is_string()) {
        return bad("added_tokens: expected objects with an integer 'id' and a string 'content'");
      }
      DUET_RETURN_IF_ERROR(
          place(a["id"].get<int64_t>(), a["content"].get<std::string>(),
                a.value("special", false) ? TokenKind::kControl : TokenKind::kUserDefined));
    }
  }
  if (m.contains("merges") && !m["merges"].is_array()) {
    return bad("model.merges: expected an array, got " + JsonTypeName(m["merges"]));
  }
  if (m.contains("merges")) {
    const nlohmann::json& ms = m["merges"];
    for (size_t k = 0; k < ms.size(); ++k) {
      if (ms[k].is_string()) {
        DUET_ASSIGN_OR_RETURN(auto mm, SplitMerge(ms[k].get<std::string>(), k, path));
        spec.merges.push_back(std::move(mm));
      } else if (ms[k].is_array() && ms[k].size() == 2 && ms[k][0].is_string() &&
                 ms[k][1].is_string()) {
        spec.merges.emplace_back(ms[k][0].get<std::string>(), ms[k][1].get<std::string>());
      } else {
        return bad(absl::StrCat("model.merges[", k, "]: expected \"a b\" or [\"a\", \"b\"]"));
      }
    }
  }
  if (!tj.contains("pre_tokenizer") || tj["pre_tokenizer"].is_null()) {
    return absl::UnimplementedError(path + ": no pre_tokenizer; byte-level BPE needs one");
  }
  DUET_ASSIGN_OR_RETURN(spec.pre,
                        DetectPreTokenizer(tj["pre_tokenizer"], &spec.add_prefix_space, path));

  const std::string tc_path =
      (std::filesystem::path(path).parent_path() / "tokenizer_config.json").string();
  if (FileExists(tc_path)) {
    DUET_ASSIGN_OR_RETURN(nlohmann::json tc, ReadJsonFile(tc_path));
    if (!tc.is_object()) return absl::InvalidArgumentError(tc_path + ": expected a JSON object");
    DUET_ASSIGN_OR_RETURN(std::string bos, TokenString(tc, "bos_token", tc_path));
    DUET_ASSIGN_OR_RETURN(std::string eos, TokenString(tc, "eos_token", tc_path));
    auto id_of = [&](const std::string& t) -> int32_t {
      for (size_t i = 0; i < spec.tokens.size(); ++i) {
        if (spec.tokens[i] == t) return static_cast<int32_t>(i);
      }
      return -1;
    };
    if (!bos.empty()) spec.bos_id = id_of(bos);
    if (!eos.empty() && id_of(eos) >= 0) spec.eos_ids.push_back(id_of(eos));
    DUET_ASSIGN_OR_RETURN(std::optional<bool> add_bos,
                          GetOptionalBool(tc, "add_bos_token", tc_path));
    spec.add_bos = add_bos.value_or(false);
    auto ct = tc.find("chat_template");
    if (ct != tc.end() && ct->is_string()) {
      spec.chat_template = ct->get<std::string>();
    } else if (ct != tc.end() && ct->is_array()) {
      for (const nlohmann::json& e : *ct) {
        if (e.is_object() && e.value("name", std::string()) == "default" &&
            e.contains("template") && e["template"].is_string()) {
          spec.chat_template = e["template"].get<std::string>();
        }
      }
    }
  }
  return Create(std::move(spec));
}

}  // namespace duet::model
