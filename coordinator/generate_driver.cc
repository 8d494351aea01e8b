// The Generation service's request path: checks a request, then runs its RequestDriver
// (request_driver.h) to the last token.
#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "common/grammar/grammar_constraint.h"
#include "coordinator/coordinator_impl.h"
#include "proto/generate_request.h"

namespace duet::coordinator {

absl::Status CoordinatorServer::Impl::Generate(grpc::ServerContext* ctx,
                                               const v1::GenerateRequest& req,
                                               grpc::ServerWriter<v1::GenerateResponse>* writer) {
  return GenerateTo(req, http::GenerateSink{
                             .write = [writer](const v1::GenerateResponse& r) {
                               return writer->Write(r);
                             },
                             .cancelled = [ctx] { return ctx->IsCancelled(); }});
}

absl::Status CoordinatorServer::Impl::GenerateTo(const v1::GenerateRequest& req,
                                                 const http::GenerateSink& sink) {
  // Times the first token and the rest as the client sees them.
  const absl::Time start = absl::Now();
  absl::Time first = absl::InfinitePast(), last = absl::InfinitePast();
  int64_t tokens = 0;
  http::GenerateSink timed{.write =
                               [&](const v1::GenerateResponse& r) {
                                 if (r.has_token()) {
                                   last = absl::Now();
                                   if (tokens++ == 0) first = last;
                                 }
                                 return sink.write(r);
                               },
                           .cancelled = sink.cancelled};
  metrics_.active.Add(1);
  absl::Status s = GenerateUnmetered(req, timed);
  // The caller ended it with all it asked for (the HTTP front's stop strings): finished.
  if (absl::IsCancelled(s) && sink.satisfied && sink.satisfied()) s = absl::OkStatus();
  metrics_.active.Add(-1);
  metrics_.RecordRequest(s, start, first, last, tokens);
  return s;
}

absl::Status CoordinatorServer::Impl::GenerateUnmetered(const v1::GenerateRequest& req,
                                                        const http::GenerateSink& sink) {
  if (stopping_.load()) return absl::UnavailableError("the coordinator is shutting down");
  // ---- Validate the request before it takes any resource.
  DUET_ASSIGN_OR_RETURN(rpc::ClientPrompt prompt,
                        rpc::ParseGenerateRequest(req, *tokenizer_, model_config_));
  const std::vector<int32_t>& ids = prompt.ids;
  if (prompt.sampling.grammar.has_value()) {
    // The same check, and refusal without a compiler, as the nodes' (grammar_constraint.h).
    absl::StatusOr<std::unique_ptr<model::TokenConstraint>> compiled =
        grammar::MakeGrammarConstraint(grammar_.get(), *prompt.sampling.grammar, {});
    if (!compiled.ok()) return Annotate(compiled.status(), "Generate: structured output");
  }
  if (const int64_t max_len = MaxModelLen(); max_len > 0) {
    const int64_t want =
        static_cast<int64_t>(ids.size()) + std::max(1, req.sampling().max_tokens());
    if (want > max_len) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Generate: ", ids.size(), " prompt tokens + ", req.sampling().max_tokens(),
          " max_tokens = ", want, " exceeds max_model_len ", max_len,
          ", the longest request the cluster can hold (the model's context and the largest "
          "decode and prefill KV pools)"));
    }
  }

  DriverRequest request{.id = req.request_id().empty()
                                  ? absl::StrCat("req-", next_request_.fetch_add(1))
                                  : req.request_id(),
                        .prompt = std::move(prompt.ids),
                        .sampling = req.sampling(),
                        .return_text = req.return_text(),
                        .share_prompt_with = req.share_prompt_with()};
  const RequestId id = request.id;
  DUET_RETURN_IF_ERROR(tracker_.Start(id, absl::Now()));
  auto driver = std::make_shared<RequestDriver>(DriverEnvironment(), std::move(request), sink);
  active_.Add(driver);
  // Returns with every attempt's calls ended and threads joined, its load changes taken back.
  absl::Status status = driver->Run();
  active_.Remove(id);
  if (absl::IsCancelled(status) && sink.satisfied && sink.satisfied()) {
    DUET_LOG(INFO) << "request " << id
                   << " finished: a stop string matched, the client has all it asked for";
  } else if (!status.ok()) {
    DUET_LOG(INFO) << "request " << id << " ended: " << status;
  }
  return status;
}

DriverEnv CoordinatorServer::Impl::DriverEnvironment() {
  return DriverEnv{.tokenizer = tokenizer_.get(),
                   .max_position_embeddings = model_config_.max_position_embeddings,
                   .registry = &registry_,
                   .directory = &directory_,
                   .prefix_index = &prefix_index_,
                   .tracker = &tracker_,
                   .router = router_.get(),
                   .routes = &routes_,
                   .active = &active_,
                   .calls = &node_calls_,
                   .background = &background_,
                   .metrics = &metrics_};
}

int64_t CoordinatorServer::Impl::MaxModelLen() {
  std::optional<kv::KvLayout> layout = registry_.cluster_layout();
  if (!layout || layout->block_size <= 0) return 0;
  int64_t decode = 0, prefill = 0;
  for (const NodeInfo& n : registry_.LiveNodes(NodeKind::kDecode)) {
    decode = std::max(decode, n.load.total_blocks);
  }
  for (const NodeInfo& n : registry_.LiveNodes(NodeKind::kPrefill)) {
    prefill = std::max(prefill, n.load.total_blocks);
  }
  if (decode == 0 || prefill == 0) return 0;
  return std::min<int64_t>({model_config_.max_position_embeddings, decode * layout->block_size,
                            prefill * layout->block_size});
}

bool CoordinatorServer::Impl::Cancel(const std::string& request_id) {
  absl::StatusOr<Effects> fx = tracker_.Cancel(request_id, absl::Now());
  if (!fx.ok()) return false;
  Apply(*std::move(fx));
  return true;
}

}  // namespace duet::coordinator
