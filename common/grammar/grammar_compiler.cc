#include "common/grammar/grammar_compiler.h"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <exception>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/node_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/status.h"
#include "common/grammar/tokenizer_vocab.h"

namespace duet::grammar {
namespace {

using CompileResult = absl::StatusOr<std::shared_ptr<const CompiledGrammar>>;

// One spec's compile: done once the compile thread has stored its result.
struct Entry {
  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  CompileResult result ABSL_GUARDED_BY(mu) = absl::UnknownError("not compiled yet");
};

// A string literal of xgrammar's EBNF: quotes, backslashes and control characters escaped
// (\xHH is a code point there, the same as the byte below 0x80), other UTF-8 kept as is.
void AppendEbnfLiteral(const std::string& text, std::string* out) {
  out->push_back('"');
  for (char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(c);
    } else if (byte < 0x20 || byte == 0x7f) {
      char escaped[5];
      std::snprintf(escaped, sizeof(escaped), "\\x%02x", byte);
      out->append(escaped);
    } else {
      out->push_back(c);
    }
  }
  out->push_back('"');
}

std::string ChoiceGrammar(const std::vector<std::string>& choices) {
  std::string ebnf = "root ::= ";
  for (size_t i = 0; i < choices.size(); ++i) {
    if (i > 0) ebnf += " | ";
    AppendEbnfLiteral(choices[i], &ebnf);
  }
  return ebnf;
}

// How deep a JSON text's objects and arrays nest (the text is valid JSON).
int JsonDepth(std::string_view text) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      deepest = std::max(deepest, ++depth);
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return deepest;
}

size_t SpecBytes(const GrammarSpec& spec) {
  size_t bytes = spec.text.size();
  for (const std::string& choice : spec.choices) bytes += choice.size();
  return bytes;
}

absl::Status CheckOptions(const GrammarCompilerOptions& o) {
  auto refuse = [](absl::string_view field, auto value) {
    return absl::InvalidArgumentError(
        absl::StrCat("grammar compiler: ", field, " must be positive, not ", value));
  };
  if (o.compile_threads <= 0) return refuse("compile_threads", o.compile_threads);
  if (o.compile_timeout <= absl::ZeroDuration()) {
    return refuse("compile_timeout", absl::FormatDuration(o.compile_timeout));
  }
  if (o.max_spec_bytes == 0) return refuse("max_spec_bytes", 0);
  if (o.max_schema_depth <= 0) return refuse("max_schema_depth", o.max_schema_depth);
  if (o.max_concurrent_compiles <= 0) {
    return refuse("max_concurrent_compiles", o.max_concurrent_compiles);
  }
  if (o.max_compiled_bytes == 0) return refuse("max_compiled_bytes", 0);
  if (o.max_cached == 0) return refuse("max_cached", 0);
  if (o.json_max_whitespace <= 0) return refuse("json_max_whitespace", o.json_max_whitespace);
  return absl::OkStatus();
}

}  // namespace

struct GrammarCompiler::State {
  State(const xgrammar::TokenizerInfo& info, GrammarCompilerOptions options, int32_t vocab_size)
      : compiler(info, options.compile_threads, /*cache_enabled=*/false),
        options(options),
        vocab_size(vocab_size) {}

  // Runs xgrammar on the spec; its exceptions become errors that keep their message.
  CompileResult CompileNow(const GrammarSpec& spec) {
    std::optional<xgrammar::CompiledGrammar> compiled;
    const std::optional<int> whitespace = options.json_max_whitespace;
    try {
      switch (spec.kind) {
        case GrammarKind::kJsonObject:
          compiled = compiler.CompileJSONSchema(R"({"type": "object"})", /*any_whitespace=*/true,
                                                std::nullopt, std::nullopt,
                                                /*strict_mode=*/false, whitespace);
          break;
        case GrammarKind::kJsonSchema:
          compiled = compiler.CompileJSONSchema(spec.text, /*any_whitespace=*/true, std::nullopt,
                                                std::nullopt, spec.strict, whitespace);
          break;
        case GrammarKind::kRegex:
          compiled = compiler.CompileRegex(spec.text);
          break;
        case GrammarKind::kChoice:
          compiled = compiler.CompileGrammar(ChoiceGrammar(spec.choices), "root");
          break;
        case GrammarKind::kEbnf:
          compiled = compiler.CompileGrammar(spec.text, "root");
          break;
      }
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError(
          absl::StrCat(GrammarKindName(spec.kind), " grammar spec: out of memory compiling it"));
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(
          GrammarKindName(spec.kind), " grammar spec: the grammar engine refused it: ", e.what()));
    }
    if (!compiled.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("grammar spec: unknown kind ", static_cast<int>(spec.kind)));
    }
    auto grammar = std::make_shared<const CompiledGrammar>(spec, *std::move(compiled), vocab_size);
    if (grammar->memory_bytes() > options.max_compiled_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          GrammarKindName(spec.kind), " grammar spec: its compiled grammar takes ",
          grammar->memory_bytes(), " bytes, over the bound of ", options.max_compiled_bytes));
    }
    return grammar;
  }

  xgrammar::GrammarCompiler compiler;  // thread-safe; its own cache off (ours keys by spec)
  const GrammarCompilerOptions options;
  const int32_t vocab_size;

  absl::Mutex mu;
  // node_hash_map: `order` points at its keys, which stay put.
  absl::node_hash_map<GrammarSpec, std::shared_ptr<Entry>> cache ABSL_GUARDED_BY(mu);
  std::deque<const GrammarSpec*> order ABSL_GUARDED_BY(mu);  // cached specs, oldest first
  int running ABSL_GUARDED_BY(mu) = 0;
  int64_t started ABSL_GUARDED_BY(mu) = 0;
};

absl::StatusOr<std::unique_ptr<GrammarCompiler>> GrammarCompiler::Create(
    const model::Tokenizer& tokenizer, int32_t logits_width, GrammarCompilerOptions options) {
  DUET_RETURN_IF_ERROR(CheckOptions(options));
  DUET_ASSIGN_OR_RETURN(xgrammar::TokenizerInfo info, MakeTokenizerInfo(tokenizer, logits_width));
  try {
    return std::unique_ptr<GrammarCompiler>(
        new GrammarCompiler(std::make_shared<State>(info, options, logits_width)));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("grammar compiler: ", e.what()));
  }
}

GrammarCompiler::~GrammarCompiler() = default;

int64_t GrammarCompiler::compiles_started() const {
  absl::MutexLock lock(&state_->mu);
  return state_->started;
}

int32_t GrammarCompiler::vocab_size() const { return state_->vocab_size; }

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> GrammarCompiler::Compile(
    const GrammarSpec& spec) {
  DUET_RETURN_IF_ERROR(ValidateGrammarSpec(spec));
  const GrammarCompilerOptions& options = state_->options;
  if (SpecBytes(spec) > options.max_spec_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(GrammarKindName(spec.kind), " grammar spec: ", SpecBytes(spec),
                     " bytes, over the bound of ", options.max_spec_bytes));
  }
  // The schema converter recurses over the schema, and a deep one can compile for minutes.
  if (spec.kind == GrammarKind::kJsonSchema) {
    const int depth = JsonDepth(spec.text);
    if (depth > options.max_schema_depth) {
      return absl::InvalidArgumentError(absl::StrCat(
          "json_schema grammar spec: the schema nests ", depth, " deep, over the bound of ",
          options.max_schema_depth, " (max_schema_depth)"));
    }
  }
  std::shared_ptr<Entry> entry;
  {
    absl::MutexLock lock(&state_->mu);
    auto it = state_->cache.find(spec);
    if (it != state_->cache.end()) {
      entry = it->second;
    } else {
      if (state_->running >= options.max_concurrent_compiles) {
        return absl::ResourceExhaustedError(
            absl::StrCat("grammar compiler: ", state_->running,
                         " grammars are compiling already (max_concurrent_compiles)"));
      }
      entry = std::make_shared<Entry>();
      // The thread owns what it touches (the state, its spec, the entry): it may outlive both
      // this call and the compiler.
      try {
        std::thread([state = state_, spec, entry] {
          CompileResult result = state->CompileNow(spec);
          {
            absl::MutexLock entry_lock(&entry->mu);
            entry->result = std::move(result);
            entry->done = true;
          }
          absl::MutexLock state_lock(&state->mu);
          --state->running;
        }).detach();
      } catch (const std::system_error& e) {
        return absl::ResourceExhaustedError(
            absl::StrCat("grammar compiler: no thread to compile on: ", e.what()));
      }
      ++state_->running;
      ++state_->started;
      it = state_->cache.emplace(spec, entry).first;
      state_->order.push_back(&it->first);
      while (state_->order.size() > options.max_cached) {
        state_->cache.erase(*state_->order.front());
        state_->order.pop_front();
      }
    }
  }
  absl::MutexLock lock(&entry->mu);
  if (!entry->mu.AwaitWithTimeout(absl::Condition(&entry->done), options.compile_timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat(GrammarKindName(spec.kind), " grammar spec: compiling it took over ",
                     absl::FormatDuration(options.compile_timeout), " (compile_timeout)"));
  }
  return entry->result;
}

}  // namespace duet::grammar
