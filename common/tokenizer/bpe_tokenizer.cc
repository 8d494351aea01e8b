#include "common/tokenizer/bpe_tokenizer.h"

#include <algorithm>
#include <queue>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/special_tokens.h"
#include "common/tokenizer/unicode_tables.h"

namespace duet::model {
namespace {

// GPT-2's bytes_to_unicode: printable bytes map to themselves, the others (0-32, 127-160, 173)
// to U+0100 upward, in byte order.
struct ByteMap {
  uint32_t to_cp[256];
  std::unordered_map<uint32_t, uint8_t> to_byte;
  ByteMap() {
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      to_cp[b] = printable ? static_cast<uint32_t>(b) : next++;
      to_byte[to_cp[b]] = static_cast<uint8_t>(b);
    }
  }
};

const ByteMap& Bytes() {
  static const ByteMap* m = new ByteMap();
  return *m;
}

uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::Create(BpeSpec spec) {
  std::unique_ptr<BpeTokenizer> t(new BpeTokenizer(std::move(spec)));
  DUET_RETURN_IF_ERROR(t->Init());
  return t;
}

absl::Status BpeTokenizer::Init() {
  const std::string& src = spec_.source;
  const size_t n = spec_.tokens.size();
  if (n == 0 || n > (size_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat(src, ": vocabulary of ", n, " tokens; expected 1..2^30"));
  }
  if (spec_.kinds.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat(src, ": ", spec_.kinds.size(), " token types for ", n, " tokens"));
  }
  for (size_t i = 0; i < n; ++i) {
    if (spec_.kinds[i] != TokenKind::kNormal && !spec_.tokens[i].empty()) {
      specials_.emplace_back(spec_.tokens[i], static_cast<int32_t>(i));
      special_first_byte_[static_cast<uint8_t>(spec_.tokens[i][0])] = true;
    }
  }
  // spec_.tokens is left empty: table_ holds the texts.
  DUET_ASSIGN_OR_RETURN(table_, TokenTable::Create(std::exchange(spec_.tokens, {})));
  ids_ = TokenIndex(&table_);
  ids_.Reserve(n);
  for (size_t i = 0; i < n; ++i) ids_.Add(static_cast<int32_t>(i));
  std::stable_sort(specials_.begin(), specials_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  const ByteMap& bm = Bytes();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    AppendUtf8(bm.to_cp[b], &s);
    // Some vocabularies (SmolLM's) lack a few control bytes: such bytes are dropped when
    // encoding, as HF tokenizers (no unk token) and llama.cpp do.
    byte_ids_[b] = ids_.Find(s);
  }
  merges_.reserve(spec_.merges.size());
  for (size_t r = 0; r < spec_.merges.size(); ++r) {
    const auto& [a, b] = spec_.merges[r];
    const int32_t ia = ids_.Find(a), ib = ids_.Find(b), ic = ids_.Find(a + b);
    if (ia < 0 || ib < 0 || ic < 0) {
      return absl::InvalidArgumentError(absl::StrCat(src, ": merge #", r, " '", a, " ", b, "': ",
                                                     ia < 0   ? "'" + a + "'"
                                                     : ib < 0 ? "'" + b + "'"
                                                              : "'" + a + b + "'",
                                                     " is not in the vocabulary"));
    }
    // The first (lowest-rank) occurrence of a pair wins.
    merges_.emplace(PairKey(ia, ib), Merge{static_cast<int32_t>(r), ic});
  }
  decltype(spec_.merges)().swap(spec_.merges);  // held as merges_; the capacity is freed too
  auto check_id = [&](int32_t id, const char* what) -> absl::Status {
    if (id < -1 || id >= static_cast<int32_t>(n)) {
      return absl::InvalidArgumentError(
          absl::StrCat(src, ": ", what, " id ", id, " is outside the vocabulary of ", n));
    }
    return absl::OkStatus();
  };
  DUET_RETURN_IF_ERROR(check_id(spec_.bos_id, "BOS"));
  for (int32_t e : spec_.eos_ids) DUET_RETURN_IF_ERROR(check_id(e, "EOS"));
  spec_.eos_ids.erase(std::remove(spec_.eos_ids.begin(), spec_.eos_ids.end(), -1),
                      spec_.eos_ids.end());
  if (spec_.add_bos && spec_.bos_id < 0) spec_.add_bos = false;
  // The chat family's end-of-turn token ends generation too (Llama-3's <|eot_id|> when the
  // model names <|end_of_text|> as EOS, Gemma's <end_of_turn>), as the models' generation
  // configs list it.
  if (const std::string eot = EndOfTurnToken(spec_.chat_template); !eot.empty()) {
    const int32_t id = ids_.Find(eot);
    if (id >= 0 &&
        std::find(spec_.eos_ids.begin(), spec_.eos_ids.end(), id) == spec_.eos_ids.end()) {
      spec_.eos_ids.push_back(id);
    }
  }
  return absl::OkStatus();
}

std::string BpeTokenizer::name() const { return absl::StrCat("bpe-", PreTokenizerName(spec_.pre)); }

bool BpeTokenizer::IsControl(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return false;
  return spec_.kinds[id] == TokenKind::kControl;
}

int32_t BpeTokenizer::TokenId(const std::string& text) const { return ids_.Find(text); }

void BpeTokenizer::EncodeWord(std::string_view word, std::vector<int32_t>* out) const {
  if (spec_.ignore_merges) {
    std::string mapped;
    for (char c : word) AppendUtf8(Bytes().to_cp[static_cast<uint8_t>(c)], &mapped);
    const int32_t id = ids_.Find(mapped);
    if (id >= 0 && spec_.kinds[id] == TokenKind::kNormal) {
      out->push_back(id);
      return;
    }
  }
  struct Symbol {
    int32_t id;
    int32_t prev, next;
  };
  std::vector<Symbol> syms;
  syms.reserve(word.size());
  for (char c : word) {
    const int32_t id = byte_ids_[static_cast<uint8_t>(c)];
    if (id < 0) continue;  // a byte the vocabulary lacks
    const int32_t i = static_cast<int32_t>(syms.size());
    syms.push_back({id, i - 1, -1});
    if (i > 0) syms[i - 1].next = i;
  }
  // Candidate merges ordered by (rank, position); stale entries are skipped when popped.
  struct Candidate {
    int32_t rank, left, left_id, right_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto push = [&](int32_t left) {
    if (left < 0 || syms[left].next < 0) return;
    const int32_t right = syms[left].next;
    auto it = merges_.find(PairKey(syms[left].id, syms[right].id));
    if (it != merges_.end()) heap.push({it->second.rank, left, syms[left].id, syms[right].id});
  };
  for (size_t i = 0; i + 1 < syms.size(); ++i) push(static_cast<int32_t>(i));
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& l = syms[c.left];
    if (l.id != c.left_id || l.next < 0 || syms[l.next].id != c.right_id) continue;
    const int32_t right = l.next;
    l.id = merges_.at(PairKey(c.left_id, c.right_id)).result;
    l.next = syms[right].next;
    if (l.next >= 0) syms[l.next].prev = c.left;
    syms[right].id = -1;  // dead
    push(l.prev);
    push(c.left);
  }
  for (int32_t i = syms.empty() ? -1 : 0; i >= 0; i = syms[i].next) out->push_back(syms[i].id);
}

void BpeTokenizer::EncodeText(std::string_view text, std::vector<int32_t>* out) const {
  for (std::string_view word : PreTokenize(spec_.pre, text)) EncodeWord(word, out);
}

absl::StatusOr<std::vector<int32_t>> BpeTokenizer::Encode(const std::string& text,
                                                          bool add_bos) const {
  std::vector<int32_t> ids;
  auto match = [&](std::string_view t, size_t pos, size_t* len) -> int32_t {
    if (!special_first_byte_[static_cast<uint8_t>(t[pos])]) return -1;
    for (const auto& [s, id] : specials_) {
      if (t.compare(pos, s.size(), s) == 0) {
        *len = s.size();
        return id;
      }
    }
    return -1;
  };
  auto plain = [&](std::string_view seg, bool at_start) {
    if (at_start && spec_.add_prefix_space && seg[0] != ' ') {
      EncodeText(" " + std::string(seg), &ids);
    } else {
      EncodeText(seg, &ids);
    }
  };
  EncodeAroundSpecials(text, match, plain, &ids);
  if (add_bos && spec_.add_bos) PrependBosOnce(spec_.bos_id, &ids);
  return ids;
}

absl::StatusOr<std::string> BpeTokenizer::Decode(const std::vector<int32_t>& ids) const {
  const ByteMap& bm = Bytes();
  std::string out;
  for (int32_t id : ids) {
    if (id < 0) return absl::InvalidArgumentError(absl::StrCat("Decode: negative token id ", id));
    if (id >= vocab_size()) continue;  // a padded embedding row: no text (as vLLM)
    const std::string_view t = table_.Text(id);
    if (spec_.kinds[id] != TokenKind::kNormal) {
      out += t;
      continue;
    }
    for (size_t pos = 0; pos < t.size();) {
      size_t len;
      const uint32_t cp = DecodeUtf8(t, pos, &len);
      auto it = bm.to_byte.find(cp);
      if (it != bm.to_byte.end()) {
        out.push_back(static_cast<char>(it->second));
      } else {
        out.append(t.substr(pos, len));  // not a byte-level character: keep it as is
      }
      pos += len;
    }
  }
  return out;
}

}  // namespace duet::model
