// GrammarCompiler: compiles GrammarSpecs against one tokenizer's vocabulary, each distinct spec
// once. A compiled grammar holds, per grammar state, which tokens it admits; every request with
// that spec shares it through its own GrammarMatcher (grammar_matcher.h).
//
//   DUET_ASSIGN_OR_RETURN(std::unique_ptr<GrammarCompiler> compiler,
//                         GrammarCompiler::Create(*tokenizer, config.vocab_size, {}));
//   DUET_ASSIGN_OR_RETURN(std::shared_ptr<const CompiledGrammar> grammar,
//                         compiler->Compile(GrammarSpec::JsonSchema(schema)));
//
// The cache is keyed by the spec's hash and compared on its whole content (kind, text, choices,
// strict), so a hash collision never hands out another spec's grammar. A spec compiles on a
// background thread while its callers wait, each until compile_timeout; one that takes longer
// is a DeadlineExceeded for them, keeps compiling (xgrammar's compile cannot be interrupted) and
// serves later callers once done, so a hostile spec costs one compile, never a hang. The other
// bounds: the spec's bytes, a schema's nesting, the compiles running at once, the compiled
// grammar's memory.
// Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/grammar/grammar_spec.h"
#include "common/tokenizer/tokenizer.h"
#include "xgrammar/compiler.h"

namespace duet::grammar {

struct GrammarCompilerOptions {
  int compile_threads = 2;                             // xgrammar's threads within one compile
  absl::Duration compile_timeout = absl::Seconds(10);  // how long Compile waits for a compile
  size_t max_spec_bytes = 64 << 10;                    // the text, or the choices together
  int max_schema_depth = 64;                           // json_schema: the schema's JSON nesting
  int max_concurrent_compiles = 4;                // more distinct specs at once: ResourceExhausted
  size_t max_compiled_bytes = size_t{256} << 20;  // a compiled grammar's memory
  size_t max_cached = 256;                        // compiled specs kept (oldest dropped first)
  // JSON kinds: whitespace the model may put between tokens, at most this many characters in a
  // row (a small model can otherwise emit whitespace until max_tokens).
  int json_max_whitespace = 32;
};

// A grammar compiled for one vocabulary; immutable, shared by every matcher of its spec.
class CompiledGrammar {
 public:
  CompiledGrammar(GrammarSpec spec, xgrammar::CompiledGrammar compiled, int32_t vocab_size)
      : spec_(std::move(spec)), compiled_(std::move(compiled)), vocab_size_(vocab_size) {}

  const GrammarSpec& spec() const { return spec_; }
  const xgrammar::CompiledGrammar& xgrammar() const { return compiled_; }
  int32_t vocab_size() const { return vocab_size_; }  // the logits row's width
  size_t memory_bytes() const { return compiled_.MemorySizeBytes(); }

 private:
  GrammarSpec spec_;
  xgrammar::CompiledGrammar compiled_;
  int32_t vocab_size_;
};

class GrammarCompiler {
 public:
  // logits_width: the model's vocabulary size (see MakeTokenizerInfo); options are checked
  // (InvalidArgument naming the field).
  static absl::StatusOr<std::unique_ptr<GrammarCompiler>> Create(const model::Tokenizer& tokenizer,
                                                                 int32_t logits_width,
                                                                 GrammarCompilerOptions options);
  ~GrammarCompiler();
  GrammarCompiler(const GrammarCompiler&) = delete;
  GrammarCompiler& operator=(const GrammarCompiler&) = delete;

  // The spec's compiled grammar, compiling it if it is not cached. InvalidArgument for a spec
  // that ValidateGrammarSpec refuses, that is too long, or that the engine cannot compile (an
  // invalid or unsupported schema, regex or grammar: the message names the kind and the cause);
  // DeadlineExceeded past compile_timeout; ResourceExhausted over the other bounds.
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> Compile(const GrammarSpec& spec);

  // Compiles started so far (each distinct spec once while it stays cached).
  int64_t compiles_started() const;
  int32_t vocab_size() const;

 private:
  struct State;
  explicit GrammarCompiler(std::shared_ptr<State> state) : state_(std::move(state)) {}
  // Shared with the compile threads, which may outlive the compiler.
  std::shared_ptr<State> state_;
};

}  // namespace duet::grammar
