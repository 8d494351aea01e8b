#include "common/tokenizer/spm_tokenizer.h"

#include <algorithm>
#include <cmath>
#include <queue>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/special_tokens.h"
#include "common/tokenizer/unicode_tables.h"

namespace duet::model {
namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space

std::string EscapeSpaces(std::string_view text) {
  std::string out;
  out.reserve(text.size() + text.size() / 4);
  for (char c : text) {
    if (c == ' ') {
      out.append(kSpace);
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string UnescapeSpaces(std::string_view piece) {
  std::string out;
  out.reserve(piece.size());
  for (size_t pos = 0; pos < piece.size();) {
    if (piece.compare(pos, kSpace.size(), kSpace) == 0) {
      out.push_back(' ');
      pos += kSpace.size();
    } else {
      out.push_back(piece[pos++]);
    }
  }
  return out;
}

// The byte of a "<0xAB>" piece, or -1.
int ParseBytePiece(const std::string& piece) {
  if (piece.size() != 6 || piece.compare(0, 3, "<0x") != 0 || piece[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int hi = hex(piece[3]), lo = hex(piece[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

}  // namespace

void SpmTokenizer::WholeMatcher::Add(std::string_view piece, int32_t id) {
  if (piece.empty() || !ids.Add(id)) return;  // the first id wins
  std::vector<size_t>& lens = lengths[static_cast<uint8_t>(piece[0])];
  auto it = std::lower_bound(lens.begin(), lens.end(), piece.size(), std::greater<size_t>());
  if (it == lens.end() || *it != piece.size()) lens.insert(it, piece.size());
}

int32_t SpmTokenizer::WholeMatcher::Match(std::string_view text, size_t pos, size_t* len) const {
  for (size_t n : lengths[static_cast<uint8_t>(text[pos])]) {
    if (n > text.size() - pos) continue;
    const int32_t id = ids.Find(text.substr(pos, n));
    if (id >= 0) {
      *len = n;
      return id;
    }
  }
  return -1;
}

absl::StatusOr<std::unique_ptr<SpmTokenizer>> SpmTokenizer::Create(SpmSpec spec) {
  std::unique_ptr<SpmTokenizer> t(new SpmTokenizer(std::move(spec)));
  DUET_RETURN_IF_ERROR(t->Init());
  return t;
}

absl::Status SpmTokenizer::Init() {
  const std::string& src = spec_.source;
  const size_t n = spec_.tokens.size();
  if (n == 0 || n > (size_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat(src, ": vocabulary of ", n, " tokens; expected 1..2^30"));
  }
  if (spec_.scores.size() != n || spec_.types.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(src, ": ", spec_.scores.size(), " scores and ",
                                                   spec_.types.size(), " token types for ", n,
                                                   " tokens"));
  }
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(spec_.scores[i])) {
      return absl::InvalidArgumentError(absl::StrCat(src, ": token ", i, " has the score ",
                                                     spec_.scores[i], "; expected finite"));
    }
  }
  std::fill(std::begin(byte_ids_), std::end(byte_ids_), -1);
  byte_of_.assign(n, 0);
  int num_bytes = 0;
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = static_cast<int32_t>(i);
    std::string& piece = spec_.tokens[i];
    switch (spec_.types[i]) {
      case SpmTokenType::kNormal:
      case SpmTokenType::kUnknown:
      case SpmTokenType::kControl:
        break;
      case SpmTokenType::kUserDefined:
        // llama.cpp's converter writes a user-defined piece's "▁" as a space; the text is
        // matched after escaping, so the piece is too.
        piece = EscapeSpaces(piece);
        break;
      case SpmTokenType::kByte: {
        const int b = ParseBytePiece(piece);
        if (b < 0) {
          return absl::InvalidArgumentError(absl::StrCat(src, ": token ", i, " '", piece,
                                                         "' has the byte type but is not <0xXX>"));
        }
        if (byte_ids_[b] < 0) {
          byte_ids_[b] = id;
          ++num_bytes;
        }
        byte_of_[i] = static_cast<uint8_t>(b);
        break;
      }
      default:
        return absl::UnimplementedError(absl::StrCat(
            src, ": token ", i, " '", piece, "' has type ", static_cast<int>(spec_.types[i]),
            "; supported: 1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte"));
    }
  }
  // spec_.tokens is left empty: table_ holds the texts.
  DUET_ASSIGN_OR_RETURN(table_, TokenTable::Create(std::exchange(spec_.tokens, {})));
  normal_ = TokenIndex(&table_);
  controls_ = WholeMatcher(&table_);
  user_ = WholeMatcher(&table_);
  normal_.Reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = static_cast<int32_t>(i);
    const std::string_view piece = table_.Text(id);
    switch (spec_.types[i]) {
      case SpmTokenType::kNormal:
        if (!piece.empty()) normal_.Add(id);
        break;
      case SpmTokenType::kUnknown:
      case SpmTokenType::kControl:
        controls_.Add(piece, id);
        break;
      case SpmTokenType::kUserDefined:
        user_.Add(piece, id);
        break;
      default:
        break;
    }
  }
  if (num_bytes != 0 && num_bytes != 256) {
    for (int b = 0; b < 256; ++b) {
      if (byte_ids_[b] < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(src, ": the vocabulary has ", num_bytes, " byte tokens but not <0x",
                         absl::Hex(b, absl::kZeroPad2), ">; byte fallback needs all 256"));
      }
    }
  }
  auto check_id = [&](int32_t id, const char* what) -> absl::Status {
    if (id < -1 || id >= static_cast<int32_t>(n)) {
      return absl::InvalidArgumentError(
          absl::StrCat(src, ": ", what, " id ", id, " is outside the vocabulary of ", n));
    }
    return absl::OkStatus();
  };
  DUET_RETURN_IF_ERROR(check_id(spec_.bos_id, "BOS"));
  DUET_RETURN_IF_ERROR(check_id(spec_.unk_id, "unknown-token"));
  for (int32_t e : spec_.eos_ids) DUET_RETURN_IF_ERROR(check_id(e, "EOS"));
  if (num_bytes == 0 && spec_.unk_id < 0) {
    return absl::InvalidArgumentError(
        src +
        ": the vocabulary has neither byte tokens <0x00>..<0xFF> nor an unknown token, so "
        "characters without a piece cannot be encoded");
  }
  spec_.eos_ids.erase(std::remove(spec_.eos_ids.begin(), spec_.eos_ids.end(), -1),
                      spec_.eos_ids.end());
  if (spec_.add_bos && spec_.bos_id < 0) spec_.add_bos = false;
  return absl::OkStatus();
}

bool SpmTokenizer::IsControl(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return false;
  return spec_.types[id] == SpmTokenType::kControl || spec_.types[id] == SpmTokenType::kUnknown;
}

int32_t SpmTokenizer::TokenId(std::string_view piece) const {
  for (const TokenIndex* m : {&normal_, &controls_.ids, &user_.ids}) {
    if (const int32_t id = m->Find(piece); id >= 0) return id;
  }
  for (int32_t i = 0; i < table_.size(); ++i) {
    if (spec_.types[i] == SpmTokenType::kByte && table_.Text(i) == piece) return i;
  }
  return -1;
}

void SpmTokenizer::EncodeRun(std::string_view text, std::vector<int32_t>* out) const {
  // One symbol per UTF-8 character (an invalid byte is a character of its own), in a linked
  // list over text; merged symbols stay contiguous.
  struct Symbol {
    size_t start, len;
    int32_t prev, next;
  };
  std::vector<Symbol> syms;
  syms.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    size_t len;
    DecodeUtf8(text, pos, &len);
    const int32_t i = static_cast<int32_t>(syms.size());
    syms.push_back({pos, len, i - 1, -1});
    if (i > 0) syms[i - 1].next = i;
    pos += len;
  }
  // Candidates by (score desc, left asc), as SentencePiece's agenda; stale ones (a side merged
  // since) are recognised by their length and skipped.
  struct Candidate {
    float score;
    int32_t left, right;
    size_t len;
  };
  auto worse = [](const Candidate& a, const Candidate& b) {
    return a.score != b.score ? a.score < b.score : a.left > b.left;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(worse)> agenda(worse);
  auto push = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const size_t len = syms[left].len + syms[right].len;
    const int32_t id = normal_.Find(text.substr(syms[left].start, len));
    if (id >= 0) agenda.push({spec_.scores[id], left, right, len});
  };
  for (size_t i = 0; i + 1 < syms.size(); ++i) {
    push(static_cast<int32_t>(i), static_cast<int32_t>(i + 1));
  }
  while (!agenda.empty()) {
    const Candidate c = agenda.top();
    agenda.pop();
    Symbol& l = syms[c.left];
    if (l.len == 0 || syms[c.right].len == 0 || l.next != c.right ||
        l.len + syms[c.right].len != c.len) {
      continue;
    }
    Symbol& r = syms[c.right];
    l.len += r.len;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = c.left;
    r.len = 0;  // dead
    push(l.prev, c.left);
    push(c.left, l.next);
  }
  bool last_unknown = false;
  for (int32_t i = syms.empty() ? -1 : 0; i >= 0; i = syms[i].next) {
    const std::string_view piece = text.substr(syms[i].start, syms[i].len);
    if (const int32_t id = normal_.Find(piece); id >= 0) {
      out->push_back(id);
      last_unknown = false;
    } else if (byte_ids_[0] >= 0) {
      for (char c : piece) out->push_back(byte_ids_[static_cast<uint8_t>(c)]);
      last_unknown = false;
    } else if (!last_unknown) {  // a run of unknown characters is one unknown token
      out->push_back(spec_.unk_id);
      last_unknown = true;
    }
  }
}

void SpmTokenizer::EncodeSegment(std::string_view text, std::vector<int32_t>* out) const {
  size_t run_start = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t len = 0;
    const int32_t id = user_.Match(text, pos, &len);
    if (id < 0) {
      size_t clen;
      DecodeUtf8(text, pos, &clen);
      pos += clen;
      continue;
    }
    EncodeRun(text.substr(run_start, pos - run_start), out);
    out->push_back(id);
    pos += len;
    run_start = pos;
  }
  EncodeRun(text.substr(run_start), out);
}

absl::StatusOr<std::vector<int32_t>> SpmTokenizer::Encode(const std::string& text,
                                                          bool add_bos) const {
  std::vector<int32_t> ids;
  auto match = [&](std::string_view t, size_t pos, size_t* len) {
    return controls_.Match(t, pos, len);
  };
  auto plain = [&](std::string_view seg, bool at_start) {
    const bool prefix = spec_.add_space_prefix && at_start;
    EncodeSegment(EscapeSpaces(prefix ? " " + std::string(seg) : std::string(seg)), &ids);
  };
  EncodeAroundSpecials(text, match, plain, &ids);
  if (add_bos && spec_.add_bos) PrependBosOnce(spec_.bos_id, &ids);
  return ids;
}

absl::StatusOr<std::string> SpmTokenizer::Decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0) return absl::InvalidArgumentError(absl::StrCat("Decode: negative token id ", id));
    if (id >= vocab_size()) continue;  // a padded embedding row: no text (as vLLM)
    switch (spec_.types[id]) {
      case SpmTokenType::kByte:
        out.push_back(static_cast<char>(byte_of_[id]));
        break;
      case SpmTokenType::kNormal:
      case SpmTokenType::kUserDefined:
        out += UnescapeSpaces(table_.Text(id));
        break;
      default:
        out += table_.Text(id);
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<SpmTokenizer>> SpmTokenizer::FromGguf(const GgufFile& g) {
  const std::string& path = g.path();
  DUET_ASSIGN_OR_RETURN(std::string model, g.GetString("tokenizer.ggml.model"));
  if (model != "llama") {
    return absl::UnimplementedError(path + ": tokenizer.ggml.model '" + model +
                                    "' is not SentencePiece BPE; SpmTokenizer reads 'llama'");
  }
  auto get_bool = [&](const std::string& key, bool fallback) -> absl::StatusOr<bool> {
    if (!g.Find(key)) return fallback;
    return g.GetBool(key);
  };
  // Every tokenizer.ggml.* key is read, harmless (ids of tokens that encoding does not use) or
  // refused by name. Named templates (tokenizer.chat_template.*) are not read.
  for (const auto& [key, value] : g.metadata()) {
    if (!key.starts_with("tokenizer.ggml.")) continue;
    const std::string k = key.substr(std::string_view("tokenizer.ggml.").size());
    if (k == "model" || k == "pre" || k == "tokens" || k == "scores" || k == "token_type" ||
        k == "add_bos_token" || k == "add_space_prefix" || k.ends_with("_token_id")) {
      continue;
    }
    if (k == "add_eos_token" || k == "add_sep_token" || k == "remove_extra_whitespaces") {
      DUET_ASSIGN_OR_RETURN(bool on, get_bool(key, false));
      if (!on) continue;
      return absl::UnimplementedError(path + ": " + key +
                                      " = true is not supported by the SentencePiece tokenizer");
    }
    if (k == "merges") {
      return absl::UnimplementedError(
          path +
          ": tokenizer.ggml.merges with tokenizer.ggml.model 'llama' is not supported "
          "(SentencePiece BPE merges by tokenizer.ggml.scores)");
    }
    if (k == "precompiled_charsmap") {
      return absl::UnimplementedError(
          path +
          ": tokenizer.ggml.precompiled_charsmap (a SentencePiece normalizer) is not "
          "supported; only the identity normalizer");
    }
    return absl::UnimplementedError(path + ": " + key +
                                    " is not supported by the SentencePiece tokenizer");
  }
  DUET_ASSIGN_OR_RETURN(std::optional<std::string> pre, g.GetOptionalString("tokenizer.ggml.pre"));
  if (pre && *pre != "default") {
    return absl::UnimplementedError(path + ": tokenizer.ggml.pre '" + *pre +
                                    "' is not supported with tokenizer.ggml.model 'llama'; "
                                    "supported: default");
  }
  SpmSpec spec;
  spec.source = path;
  DUET_ASSIGN_OR_RETURN(spec.tokens, g.GetStringArray("tokenizer.ggml.tokens"));
  const size_t n = spec.tokens.size();
  const GgufValue* scores = g.Find("tokenizer.ggml.scores");
  if (scores == nullptr) {
    return absl::InvalidArgumentError(path +
                                      ": no metadata key 'tokenizer.ggml.scores' (SentencePiece "
                                      "BPE merges by score)");
  }
  if (scores->type != GgufType::kArray || scores->array_type != GgufType::kFloat32) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": tokenizer.ggml.scores has type ", GgufTypeName(scores->type),
        scores->type == GgufType::kArray ? absl::StrCat(" of ", GgufTypeName(scores->array_type))
                                         : "",
        "; expected an array of float32"));
  }
  if (scores->floats.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": tokenizer.ggml.scores has ",
                                                   scores->floats.size(), " entries; expected ", n,
                                                   " (one per token)"));
  }
  spec.scores.assign(scores->floats.begin(), scores->floats.end());
  if (!g.Find("tokenizer.ggml.token_type")) {
    return absl::InvalidArgumentError(path +
                                      ": no metadata key 'tokenizer.ggml.token_type' (byte and "
                                      "control tokens are told by their type)");
  }
  DUET_ASSIGN_OR_RETURN(std::vector<int64_t> types, g.GetIntArray("tokenizer.ggml.token_type"));
  if (types.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": tokenizer.ggml.token_type has ",
                                                   types.size(), " entries; expected ", n,
                                                   " (one per token)"));
  }
  spec.types.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (types[i] < 1 || types[i] > 6) {
      return absl::UnimplementedError(
          absl::StrCat(path, ": token ", i, " '", spec.tokens[i], "' has type ", types[i],
                       "; supported: 1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte"));
    }
    spec.types.push_back(static_cast<SpmTokenType>(types[i]));
  }
  // llama.cpp's defaults for a SentencePiece vocabulary that does not say.
  DUET_ASSIGN_OR_RETURN(spec.add_bos, get_bool("tokenizer.ggml.add_bos_token", true));
  DUET_ASSIGN_OR_RETURN(spec.add_space_prefix, get_bool("tokenizer.ggml.add_space_prefix", true));
  auto get_id = [&](const char* key) -> absl::StatusOr<int32_t> {
    DUET_ASSIGN_OR_RETURN(std::optional<int64_t> v, g.GetOptionalInt(key));
    if (!v) return -1;
    if (*v < 0 || *v >= static_cast<int64_t>(n)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": ", key, " ", *v, " is outside the vocabulary of ", n));
    }
    return static_cast<int32_t>(*v);
  };
  DUET_ASSIGN_OR_RETURN(spec.bos_id, get_id("tokenizer.ggml.bos_token_id"));
  DUET_ASSIGN_OR_RETURN(spec.unk_id, get_id("tokenizer.ggml.unknown_token_id"));
  DUET_ASSIGN_OR_RETURN(std::optional<std::string> tmpl,
                        g.GetOptionalString("tokenizer.chat_template"));
  spec.chat_template = tmpl.value_or("");
  std::vector<int32_t> eos;
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                          "tokenizer.ggml.eom_token_id"}) {
    DUET_ASSIGN_OR_RETURN(int32_t id, get_id(key));
    eos.push_back(id);
  }
  // The end-of-turn token of the template's family, and Gemma's <end_of_turn> (which Gemma's
  // generation config lists beside <eos>), when the vocabulary has it as a special token.
  for (const std::string& text :
       {EndOfTurnToken(spec.chat_template), std::string("<end_of_turn>")}) {
    if (text.empty()) continue;
    for (size_t i = 0; i < n; ++i) {
      if (spec.tokens[i] == text && (spec.types[i] == SpmTokenType::kControl ||
                                     spec.types[i] == SpmTokenType::kUserDefined)) {
        eos.push_back(static_cast<int32_t>(i));
        break;
      }
    }
  }
  for (int32_t id : eos) {
    if (id >= 0 && std::find(spec.eos_ids.begin(), spec.eos_ids.end(), id) == spec.eos_ids.end()) {
      spec.eos_ids.push_back(id);
    }
  }
  return Create(std::move(spec));
}

}  // namespace duet::model
