#include "common/model/model_runner.h"

#include <cmath>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/model/rope.h"

namespace duet::model {

struct ModelRunner::Layer {
  const float* input_norm = nullptr;
  const float* post_norm = nullptr;  // the MLP input's norm
  const float* q_norm = nullptr;     // [head_dim] (qk_norm)
  const float* k_norm = nullptr;
  const float* attn_output_norm = nullptr;  // gemma's sandwich norms
  const float* mlp_output_norm = nullptr;
  const compute::RopeParams* rope = nullptr;  // full or sliding-layer frequencies
  int window = 0;                             // sliding window, 0 = full context
  const float* q_bias = nullptr;
  const float* k_bias = nullptr;
  const float* v_bias = nullptr;
  std::unique_ptr<compute::PreparedMatrix> q, k, v, o, gate, up, down;
};

// Activation buffers in backend memory, grown to the largest batch seen.
struct ModelRunner::Workspace {
  compute::ComputeBackend* backend = nullptr;
  int64_t rows = 0;
  float* x = nullptr;     // [rows, hidden] residual stream
  float* h = nullptr;     // [rows, hidden] normed
  float* q = nullptr;     // [rows, q_heads * head_dim]
  float* k = nullptr;     // [rows, kv_heads * head_dim]
  float* v = nullptr;
  float* attn = nullptr;  // [rows, q_heads * head_dim]
  float* o = nullptr;     // [rows, hidden]
  float* gate = nullptr;  // [rows, intermediate]
  float* up = nullptr;
  float* last = nullptr;    // [rows, hidden] gathered last-token states
  int64_t logit_rows = 0;
  float* logits = nullptr;  // [logit_rows, vocab]

  void Free() {
    for (float** p : {&x, &h, &q, &k, &v, &attn, &o, &gate, &up, &logits, &last}) {
      if (*p != nullptr) backend->FreeActivations(*p);
      *p = nullptr;
    }
    rows = 0;
    logit_rows = 0;
  }
  ~Workspace() { Free(); }
};

ModelRunner::ModelRunner(const ModelConfig& config, compute::ComputeBackend* backend)
    : config_(config), backend_(backend), ws_(std::make_unique<Workspace>()) {
  ws_->backend = backend;
}

ModelRunner::~ModelRunner() {
  ws_.reset();
  if (owned_embed_ != nullptr) backend_->FreeActivations(owned_embed_);
}

absl::StatusOr<std::unique_ptr<ModelRunner>> ModelRunner::Create(const ModelConfig& config,
                                                                 ModelWeights weights,
                                                                 compute::ComputeBackend* backend) {
  if (backend == nullptr) return absl::InvalidArgumentError("ModelRunner: backend is null");
  DUET_RETURN_IF_ERROR(config.Validate());
  if (static_cast<int>(weights.layers.size()) != config.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat("ModelRunner: weights have ",
                                                   weights.layers.size(), " layers, config says ",
                                                   config.num_hidden_layers));
  }
  std::unique_ptr<ModelRunner> runner(new ModelRunner(config, backend));
  DUET_RETURN_IF_ERROR(runner->Prepare(std::move(weights)));
  return runner;
}

absl::Status ModelRunner::Prepare(ModelWeights weights) {
  const ModelConfig& c = config_;
  const int hidden = c.hidden_size;
  const int qd = c.num_attention_heads * c.head_dim;
  const int kvd = c.num_key_value_heads * c.head_dim;
  SetUpLayerAttention();

  auto vec = [&](std::vector<float>& v) -> const float* {
    if (v.empty()) return nullptr;
    host_vectors_.push_back(std::move(v));
    const std::vector<float>& kept = host_vectors_.back();
    return backend_->UploadVector(kept.data(), static_cast<int64_t>(kept.size()));
  };
  // A matrix from its float copy, or from its stored form (weights_dtype native or bf16).
  auto mat = [&](const std::string& name, std::vector<float>& w, int rows, int cols,
                 std::unique_ptr<compute::PreparedMatrix>* out) -> absl::Status {
    if (auto it = weights.stored.find(name); it != weights.stored.end()) {
      DUET_ASSIGN_OR_RETURN(compute::WeightFormat format, StoredFormat(name, it->second));
      const int64_t expected = compute::StoredMatrixBytes(format, rows, cols);
      const bool blocks = format != compute::WeightFormat::kBf16 &&
                          format != compute::WeightFormat::kF16;
      if ((blocks && cols % 32 != 0) || static_cast<int64_t>(it->second.size()) != expected) {
        return absl::InvalidArgumentError(absl::StrCat(
            "ModelRunner: stored ", compute::WeightFormatName(format), " matrix '", name, "' has ",
            it->second.size(), " bytes; [", rows, ", ", cols, "] needs ", expected));
      }
      absl::StatusOr<std::unique_ptr<compute::PreparedMatrix>> prepared =
          backend_->PrepareStoredMatrix(
              {.format = format, .data = it->second.data(), .rows = rows, .cols = cols});
      if (!prepared.ok()) return Annotate(prepared.status(), "matrix '" + name + "'");
      *out = *std::move(prepared);
      it->second.DropPages();  // repacked: a view's file pages leave resident memory
      weights.stored.erase(it);
      return absl::OkStatus();
    }
    if (w.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("ModelRunner: matrix '", name, "' is missing"));
    }
    DUET_ASSIGN_OR_RETURN(*out, backend_->PrepareMatrix(w.data(), rows, cols));
    std::vector<float>().swap(w);  // repacked: drop the host copy
    return absl::OkStatus();
  };

  // The embedding and LM head first: the largest matrices are repacked while the least else is
  // resident (a view's file pages and its packed copy are resident together for a moment).
  constexpr const char* kEmbed = "model.embed_tokens.weight";
  if (weights.stored.count(kEmbed) != 0) {
    // The embedding kept in its stored form: one prepared matrix serves the lookups
    // (EmbedFromMatrix) and, when tied, the LM head.
    std::vector<float> none;
    DUET_RETURN_IF_ERROR(mat(kEmbed, none, c.vocab_size, hidden, &embed_matrix_));
  }
  if (weights.lm_head.empty() && weights.stored.count("lm_head.weight") == 0) {  // tied
    if (embed_matrix_ == nullptr) {
      DUET_ASSIGN_OR_RETURN(
          lm_head_, backend_->PrepareMatrix(weights.embed_tokens.data(), c.vocab_size, hidden));
    }
  } else {
    DUET_RETURN_IF_ERROR(mat("lm_head.weight", weights.lm_head, c.vocab_size, hidden, &lm_head_));
  }
  layers_.resize(c.num_hidden_layers);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    LayerWeights& lw = weights.layers[i];
    Layer& l = layers_[i];
    l.input_norm = vec(lw.input_norm);
    l.post_norm = vec(lw.post_attention_norm);
    l.q_norm = vec(lw.q_norm);
    l.k_norm = vec(lw.k_norm);
    l.attn_output_norm = vec(lw.attn_output_norm);
    l.mlp_output_norm = vec(lw.mlp_output_norm);
    if (c.qk_norm != (l.q_norm != nullptr && l.k_norm != nullptr) ||
        c.is_gemma() != (l.attn_output_norm != nullptr && l.mlp_output_norm != nullptr)) {
      return absl::InvalidArgumentError(
          absl::StrCat("ModelRunner: layer ", i, "'s norm weights do not match ", c.architecture));
    }
    l.q_bias = vec(lw.q_bias);
    l.k_bias = vec(lw.k_bias);
    l.v_bias = vec(lw.v_bias);
    const std::string p = absl::StrCat("model.layers.", i, ".");
    DUET_RETURN_IF_ERROR(mat(p + "self_attn.q_proj.weight", lw.q_proj, qd, hidden, &l.q));
    DUET_RETURN_IF_ERROR(mat(p + "self_attn.k_proj.weight", lw.k_proj, kvd, hidden, &l.k));
    DUET_RETURN_IF_ERROR(mat(p + "self_attn.v_proj.weight", lw.v_proj, kvd, hidden, &l.v));
    DUET_RETURN_IF_ERROR(mat(p + "self_attn.o_proj.weight", lw.o_proj, hidden, qd, &l.o));
    DUET_RETURN_IF_ERROR(
        mat(p + "mlp.gate_proj.weight", lw.gate_proj, c.intermediate_size, hidden, &l.gate));
    DUET_RETURN_IF_ERROR(
        mat(p + "mlp.up_proj.weight", lw.up_proj, c.intermediate_size, hidden, &l.up));
    DUET_RETURN_IF_ERROR(
        mat(p + "mlp.down_proj.weight", lw.down_proj, hidden, c.intermediate_size, &l.down));
  }
  final_norm_ = vec(weights.norm);
  if (!weights.stored.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("ModelRunner: stored matrix '",
                                                   weights.stored.begin()->first,
                                                   "' is not a matrix of ", c.architecture));
  }
  if (embed_matrix_ != nullptr) return absl::OkStatus();
  host_embed_ = std::move(weights.embed_tokens);
  // Gemma scales the embeddings it looks up (not the tied LM head, prepared above).
  if (const float scale = c.EmbeddingScale(); scale != 1.0f) {
    for (float& e : host_embed_) e *= scale;
  }
  embed_ = backend_->UploadVector(host_embed_.data(), static_cast<int64_t>(host_embed_.size()));
  return absl::OkStatus();
}

absl::StatusOr<compute::WeightFormat> ModelRunner::StoredFormat(const std::string& name,
                                                                const StoredWeight& w) {
  switch (w.ggml_type) {
    case 8:
      return compute::WeightFormat::kQ8_0;
    case 2:
      return compute::WeightFormat::kQ4_0;
    case 3:
      return compute::WeightFormat::kQ4_1;
    case 6:
      return compute::WeightFormat::kQ5_0;
    case 7:
      return compute::WeightFormat::kQ5_1;
    case 12:
      return compute::WeightFormat::kQ4_K;
    case 13:
      return compute::WeightFormat::kQ5_K;
    case 14:
      return compute::WeightFormat::kQ6_K;
    case 10:
      return compute::WeightFormat::kQ2_K;
    case 11:
      return compute::WeightFormat::kQ3_K;
    case kGgmlF16:
      return compute::WeightFormat::kF16;
    case kGgmlBf16:
      return compute::WeightFormat::kBf16;
    default:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "ModelRunner: stored matrix '", name, "' has ggml type ", w.ggml_type,
      "; only Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, F16 and BF16 are "
      "kept"));
}

int64_t ModelRunner::MatrixBytes() const {
  int64_t total = 0;
  auto add = [&](const compute::PreparedMatrix* m) {
    if (m == nullptr) return;
    total += m->bytes() >= 0 ? m->bytes() : int64_t{m->rows()} * m->cols() * 4;
  };
  for (const Layer& l : layers_) {
    for (const auto* m : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down}) add(m->get());
  }
  add(lm_head_ != nullptr ? lm_head_.get() : embed_matrix_.get());
  return total;
}

absl::StatusOr<std::unique_ptr<ModelRunner>> ModelRunner::CreateRandom(
    const ModelConfig& config, uint64_t seed, compute::ComputeBackend* backend) {
  if (backend == nullptr) return absl::InvalidArgumentError("ModelRunner: backend is null");
  DUET_RETURN_IF_ERROR(config.Validate());
  std::unique_ptr<ModelRunner> runner(new ModelRunner(config, backend));
  DUET_RETURN_IF_ERROR(runner->PrepareRandom(seed));
  return runner;
}

absl::Status ModelRunner::PrepareRandom(uint64_t seed) {
  const ModelConfig& c = config_;
  const int hidden = c.hidden_size;
  const int qd = c.num_attention_heads * c.head_dim;
  const int kvd = c.num_key_value_heads * c.head_dim;
  SetUpLayerAttention();
  uint64_t stream = seed * 1000003ull;
  auto vec = [&](int64_t n, bool ones) -> const float* {
    std::vector<float> v(static_cast<size_t>(n), 1.0f);
    if (!ones) compute::FillUniformHost(v.data(), n, ++stream, 0.1f);
    host_vectors_.push_back(std::move(v));
    return backend_->UploadVector(host_vectors_.back().data(), n);
  };
  auto mat = [&](int rows, int cols, std::unique_ptr<compute::PreparedMatrix>* out) -> absl::Status {
    const float scale = std::sqrt(3.0f / static_cast<float>(cols));
    DUET_ASSIGN_OR_RETURN(*out, backend_->PrepareRandomMatrix(rows, cols, ++stream, scale));
    return absl::OkStatus();
  };
  layers_.resize(c.num_hidden_layers);
  for (Layer& l : layers_) {
    l.input_norm = vec(hidden, true);
    l.post_norm = vec(hidden, true);
    if (c.qk_norm) {
      l.q_norm = vec(c.head_dim, true);
      l.k_norm = vec(c.head_dim, true);
    }
    if (c.is_gemma()) {
      l.attn_output_norm = vec(hidden, true);
      l.mlp_output_norm = vec(hidden, true);
    }
    if (c.attention_bias) {
      l.q_bias = vec(qd, false);
      l.k_bias = vec(kvd, false);
      l.v_bias = vec(kvd, false);
    }
    DUET_RETURN_IF_ERROR(mat(qd, hidden, &l.q));
    DUET_RETURN_IF_ERROR(mat(kvd, hidden, &l.k));
    DUET_RETURN_IF_ERROR(mat(kvd, hidden, &l.v));
    DUET_RETURN_IF_ERROR(mat(hidden, qd, &l.o));
    DUET_RETURN_IF_ERROR(mat(c.intermediate_size, hidden, &l.gate));
    DUET_RETURN_IF_ERROR(mat(c.intermediate_size, hidden, &l.up));
    DUET_RETURN_IF_ERROR(mat(hidden, c.intermediate_size, &l.down));
  }
  final_norm_ = vec(hidden, true);
  DUET_RETURN_IF_ERROR(mat(c.vocab_size, hidden, &lm_head_));
  const int64_t embed_count = int64_t{c.vocab_size} * hidden;
  owned_embed_ = backend_->AllocateActivations(embed_count);
  if (owned_embed_ == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("ModelRunner: no memory for a ", c.vocab_size,
                                                     "x", hidden, " embedding table"));
  }
  backend_->FillRandom(owned_embed_, embed_count, ++stream, 1.0f);
  embed_ = owned_embed_;
  backend_->Synchronize();
  return backend_->status();
}

void ModelRunner::SetUpLayerAttention() {
  const ModelConfig& c = config_;
  rope_.inv_freq = RopeInvFreq(c);
  if (c.rope_local_theta > 0) local_rope_.inv_freq = RopeInvFreq(c, /*sliding_layer=*/true);
  layers_.resize(c.num_hidden_layers);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    layers_[i].window = c.LayerWindow(i);
    layers_[i].rope = c.rope_local_theta > 0 && c.LayerSlides(i) ? &local_rope_ : &rope_;
  }
}

kv::KvLayout ModelRunner::MakeKvLayout(int block_size) const {
  return kv::KvLayout{.model_id = config_.ModelId(),
                      .num_layers = config_.num_hidden_layers,
                      .num_kv_heads = config_.num_key_value_heads,
                      .head_dim = config_.head_dim,
                      .block_size = block_size,
                      .dtype = kv_dtype_};
}

kv::BlockHash ModelRunner::PrefixCacheSeed(int block_size) const {
  return kv::SeedFromText(
      absl::StrCat(MakeKvLayout(block_size).Describe(), "\n", config_.ToJsonString()));
}

absl::Status ModelRunner::SetKvDtype(kv::KvDtype dtype) {
  DUET_RETURN_IF_ERROR(backend_->CheckKvDtype(dtype));
  kv_dtype_ = dtype;
  return absl::OkStatus();
}

void ModelRunner::EnsureWorkspace(int64_t rows) {
  if (rows <= ws_->rows) return;
  ws_->Free();
  const ModelConfig& c = config_;
  const int64_t qd = int64_t{c.num_attention_heads} * c.head_dim;
  const int64_t kvd = int64_t{c.num_key_value_heads} * c.head_dim;
  auto alloc = [&](int64_t n) { return backend_->AllocateActivations(rows * n); };
  ws_->x = alloc(c.hidden_size);
  ws_->h = alloc(c.hidden_size);
  ws_->q = alloc(qd);
  ws_->k = alloc(kvd);
  ws_->v = alloc(kvd);
  ws_->attn = alloc(qd);
  ws_->o = alloc(c.hidden_size);
  ws_->gate = alloc(c.intermediate_size);
  ws_->up = alloc(c.intermediate_size);
  ws_->last = alloc(c.hidden_size);
  ws_->rows = rows;
}

absl::StatusOr<ForwardOutput> ModelRunner::Forward(absl::Span<SequenceInput> batch,
                                                   const kv::KvCacheView& kv,
                                                   const LayerDoneHook& on_layer_done,
                                                   const AbandonCheck& abandon,
                                                   const BeforeSampling& before_sampling) {
  const ModelConfig& c = config_;
  // ---- Validate everything before touching any state.
  const kv::KvLayout want = MakeKvLayout(kv.layout.block_size);
  DUET_RETURN_IF_ERROR(kv::CheckLayoutsMatch(want, kv.layout, "model", "KV pool"));
  if (batch.empty()) return absl::InvalidArgumentError("Forward: empty batch");
  int64_t total = 0;
  for (const SequenceInput& s : batch) {
    if (s.table == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("Forward: sequence ", s.seq_id, " has no block table"));
    }
    if (s.tokens.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("Forward: sequence ", s.seq_id, " has no tokens"));
    }
    if (s.start_pos != s.table->num_tokens()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Forward: sequence ", s.seq_id, " starts at position ", s.start_pos, " but its cache holds ",
          s.table->num_tokens(), " tokens"));
    }
    const int64_t end = int64_t{s.start_pos} + static_cast<int64_t>(s.tokens.size());
    if (end > c.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Forward: sequence ", s.seq_id, " reaches ", end, " tokens, past the model's context of ",
          c.max_position_embeddings));
    }
    for (int32_t t : s.tokens) {
      DUET_RETURN_IF_ERROR(
          Annotate(c.CheckTokenId(t), absl::StrCat("Forward: sequence ", s.seq_id)));
    }
    if (s.sample != nullptr) {
      if (s.sample->NeedsState() && s.sample_state == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("Forward: sequence ", s.seq_id,
                         " samples with penalties or min_tokens but has no sampling state"));
      }
      if (s.sample_state != nullptr && s.sample_state->generated() != s.sample_step) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Forward: sequence ", s.seq_id, " samples step ", s.sample_step,
            " but its sampling state has ", s.sample_state->generated(), " output tokens"));
      }
      const compute::RowSampling row = ToRowSampling(*s.sample, s.sample_step, s.sample_state);
      if (absl::Status st = compute::ValidateRowSampling(1, c.vocab_size, {row}); !st.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("Forward: sequence ", s.seq_id, ": ", st.message()));
      }
    }
    if (!s.allowed_tokens.empty() &&
        (s.sample == nullptr ||
         static_cast<int64_t>(s.allowed_tokens.size()) != TokenMaskWords(c.vocab_size))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Forward: sequence ", s.seq_id, " has a token mask of ", s.allowed_tokens.size(),
          " words; it needs a sample and ", TokenMaskWords(c.vocab_size), " words"));
    }
    if (s.table->capacity() < end) {  // Forward never allocates
      return absl::FailedPreconditionError(
          absl::StrCat("Forward: sequence ", s.seq_id, " needs room for ", end,
                       " tokens but its block table has capacity ", s.table->capacity(),
                       "; the caller grows tables first (BlockTable::Reserve, KvCacheManager)"));
    }
    total += static_cast<int64_t>(s.tokens.size());
  }

  // ---- Gather ids, positions, slots.
  EnsureWorkspace(total);
  std::vector<int32_t> ids;
  std::vector<int32_t> positions;
  std::vector<int64_t> slots;
  ids.reserve(total);
  positions.reserve(total);
  slots.reserve(total);
  std::vector<compute::AttentionSeq> seqs;
  std::vector<LayerSpan> spans;
  std::vector<int64_t> last_rows;
  bool any_logits = false;
  std::vector<std::optional<compute::RowSampling>> row_sampling;  // per output row
  std::vector<absl::Span<const int32_t>> row_allowed;             // per output row
  ForwardOutput out;
  out.vocab = c.vocab_size;
  int32_t row = 0;
  for (SequenceInput& s : batch) {
    const int32_t n = static_cast<int32_t>(s.tokens.size());
    for (int32_t i = 0; i < n; ++i) {
      ids.push_back(s.tokens[i]);
      positions.push_back(s.start_pos + i);
      slots.push_back(s.table->Slot(s.start_pos + i));
    }
    seqs.push_back(compute::AttentionSeq{
        .q_start = row, .q_len = n, .context_len = s.start_pos + n,
        .block_table = s.table->blocks().data(),
        .num_table_blocks = static_cast<int32_t>(s.table->blocks().size())});
    spans.push_back(LayerSpan{.seq_id = s.seq_id, .start_pos = s.start_pos, .num_tokens = n,
                              .blocks = &s.table->blocks()});
    if (s.all_logits) {
      // One row per new token; with `sample`, the last one also samples.
      for (int32_t i = 0; i < n; ++i) {
        last_rows.push_back(row + i);
        out.seq_ids.push_back(s.seq_id);
        const bool samples = s.sample != nullptr && i + 1 == n;
        row_sampling.push_back(
            samples ? std::optional(ToRowSampling(*s.sample, s.sample_step, s.sample_state))
                    : std::nullopt);
        row_allowed.push_back(samples ? s.allowed_tokens : absl::Span<const int32_t>());
      }
      any_logits = true;
    } else if (s.want_logits || s.sample != nullptr) {
      last_rows.push_back(row + n - 1);
      out.seq_ids.push_back(s.seq_id);
      any_logits = any_logits || s.want_logits;
      row_sampling.push_back(s.sample == nullptr ? std::nullopt
                                                 : std::optional(ToRowSampling(
                                                       *s.sample, s.sample_step, s.sample_state)));
      row_allowed.push_back(s.sample == nullptr ? absl::Span<const int32_t>() : s.allowed_tokens);
    }
    row += n;
  }

  const int hidden = c.hidden_size;
  const int rows = static_cast<int>(total);
  compute::AttentionParams attn{.num_q_heads = c.num_attention_heads,
                                .num_kv_heads = c.num_key_value_heads,
                                .head_dim = c.head_dim,
                                .scale = c.AttentionScale()};
  compute::ComputeBackend& b = *backend_;
  Workspace& w = *ws_;

  if (embed_matrix_ != nullptr) {
    DUET_RETURN_IF_ERROR(
        b.EmbedFromMatrix(*embed_matrix_, ids.data(), rows, c.EmbeddingScale(), w.x));
  } else {
    b.Embed(embed_, hidden, ids.data(), rows, w.x);
  }
  b.RmsNorm(w.x, layers_[0].input_norm, rows, hidden, c.rms_norm_eps, w.h);
  for (int li = 0; li < c.num_hidden_layers; ++li) {
    const Layer& l = layers_[li];
    // w.h holds RmsNorm(x) with this layer's input norm (fused into the previous residual add).
    const compute::MatMulProduct qkv[] = {
        {l.q.get(), l.q_bias, w.q}, {l.k.get(), l.k_bias, w.k}, {l.v.get(), l.v_bias, w.v}};
    b.MatMuls(w.h, rows, qkv);
    if (c.qk_norm) {  // per head: [rows * heads, head_dim]
      b.RmsNorm(w.q, l.q_norm, rows * c.num_attention_heads, c.head_dim, c.rms_norm_eps, w.q);
      b.RmsNorm(w.k, l.k_norm, rows * c.num_key_value_heads, c.head_dim, c.rms_norm_eps, w.k);
    }
    b.Rope(w.q, rows, c.num_attention_heads, c.head_dim, positions.data(), *l.rope);
    b.Rope(w.k, rows, c.num_key_value_heads, c.head_dim, positions.data(), *l.rope);
    b.WriteKv(kv, li, w.k, w.v, slots.data(), rows);
    // K/V of this layer are in the pool: transfer may start while the layer finishes.
    if (on_layer_done) {
      if (async_layer_hook_) {
        std::shared_ptr<compute::WorkMarker> ready = b.MarkQueuedWork();
        for (LayerSpan& span : spans) span.ready = ready;
      } else {
        b.Synchronize();
      }
      on_layer_done(li, spans);
    }
    if (abandon && li + 1 < c.num_hidden_layers && abandon()) {
      b.Synchronize();  // no queued kernel may outlive the call: the caller may free the blocks
      return absl::CancelledError(absl::StrCat("Forward: the pass was abandoned after layer ", li,
                                               " of ", c.num_hidden_layers));
    }
    attn.sliding_window = l.window;
    b.PagedAttention(kv, li, w.q, seqs, attn, w.attn);
    b.MatMul(w.attn, rows, *l.o, nullptr, w.o);
    if (l.attn_output_norm != nullptr) {
      b.RmsNorm(w.o, l.attn_output_norm, rows, hidden, c.rms_norm_eps, w.o);
    }
    b.AddRmsNorm(w.x, w.o, l.post_norm, rows, hidden, c.rms_norm_eps, w.h);
    const compute::MatMulProduct gate_up[] = {{l.gate.get(), nullptr, w.gate},
                                               {l.up.get(), nullptr, w.up}};
    b.MatMuls(w.h, rows, gate_up);
    if (c.hidden_act == "gelu_pytorch_tanh") {
      b.GeluTanhGlu(w.gate, w.up, int64_t{rows} * c.intermediate_size, w.gate);
    } else {
      b.SwiGlu(w.gate, w.up, int64_t{rows} * c.intermediate_size, w.gate);
    }
    b.MatMul(w.gate, rows, *l.down, nullptr, w.o);
    if (l.mlp_output_norm != nullptr) {
      b.RmsNorm(w.o, l.mlp_output_norm, rows, hidden, c.rms_norm_eps, w.o);
    }
    if (li + 1 < c.num_hidden_layers) {
      b.AddRmsNorm(w.x, w.o, layers_[li + 1].input_norm, rows, hidden, c.rms_norm_eps, w.h);
    } else {
      b.Add(w.x, w.o, int64_t{rows} * hidden);
    }
  }

  // Only the last token of each sequence that wants logits (every token with all_logits) goes
  // through the LM head.
  const int nl = static_cast<int>(last_rows.size());
  if (nl > 0) {
    for (int i = 0; i < nl; ++i) {
      b.CopyWithin(w.last + int64_t{i} * hidden, w.x + last_rows[i] * hidden, hidden);
    }
    if (nl > w.logit_rows) {
      if (w.logits != nullptr) b.FreeActivations(w.logits);
      w.logits = b.AllocateActivations(int64_t{nl} * c.vocab_size);
      w.logit_rows = nl;
    }
    b.RmsNorm(w.last, final_norm_, nl, hidden, c.rms_norm_eps, w.last);
    b.MatMul(w.last, nl, lm_head_ != nullptr ? *lm_head_ : *embed_matrix_, nullptr, w.logits);
    if (before_sampling) DUET_RETURN_IF_ERROR(before_sampling());
    if (any_logits) {
      out.logits.resize(int64_t{nl} * c.vocab_size);
      b.CopyToHost(out.logits.data(), w.logits, int64_t{nl} * c.vocab_size);
    }
    DUET_RETURN_IF_ERROR(SampleOutputRows(row_sampling, row_allowed, w.logits, &out));
  }
  b.Synchronize();
  DUET_RETURN_IF_ERROR(b.status());
  for (SequenceInput& s : batch) s.table->Append(static_cast<int64_t>(s.tokens.size()));
  return out;
}

absl::Status ModelRunner::SampleOutputRows(
    const std::vector<std::optional<compute::RowSampling>>& row_sampling,
    const std::vector<absl::Span<const int32_t>>& allowed, float* logits, ForwardOutput* out) {
  const int vocab = config_.vocab_size;
  const size_t rows = row_sampling.size();
  // One backend call per run of consecutive rows that sample (one run unless the batch mixes
  // sequences that only want logits with sequences that sample).
  for (size_t begin = 0; begin < rows;) {
    if (!row_sampling[begin].has_value()) {
      ++begin;
      continue;
    }
    size_t end = begin;
    std::vector<compute::RowSampling> params;
    std::vector<compute::RowMask> masks;  // structured output's rows, before they are sampled
    while (end < rows && row_sampling[end].has_value()) {
      if (!allowed[end].empty()) {
        masks.push_back({.row = static_cast<int>(end - begin), .allowed_words = allowed[end]});
      }
      params.push_back(*row_sampling[end++]);
    }
    if (!masks.empty()) {
      DUET_RETURN_IF_ERROR(backend_->MaskLogits(logits + static_cast<int64_t>(begin) * vocab,
                                                static_cast<int>(end - begin), vocab, masks));
    }
    DUET_ASSIGN_OR_RETURN(std::vector<SampledToken> tokens,
                          backend_->SampleRows(logits + static_cast<int64_t>(begin) * vocab,
                                               static_cast<int>(end - begin), vocab, params));
    out->tokens.resize(rows);
    std::move(tokens.begin(), tokens.end(), out->tokens.begin() + static_cast<int64_t>(begin));
    begin = end;
  }
  return absl::OkStatus();
}

}  // namespace duet::model
