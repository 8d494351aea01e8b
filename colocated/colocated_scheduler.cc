#include "colocated/colocated_scheduler.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status.h"

namespace duet::colocated {
namespace {

int64_t Micros(absl::Duration d) { return absl::ToInt64Microseconds(d); }

}  // namespace

// ---- Requests

struct ColocatedScheduler::Request {
  std::string id;
  std::vector<int32_t> prompt;
  model::SamplingParams params;
  model::SamplingState sampling_state;  // the prompt, then each token in `output`
  absl::Time submitted;
  absl::Time deadline;
  int64_t seq_id = 0;
  std::shared_ptr<ColocatedStream> stream = std::make_shared<ColocatedStream>();
  // Guarded by mu_.
  bool cancel_requested = false;
  // Scheduler thread only.
  Phase phase = Phase::kWaiting;
  bool done = false;
  std::unique_ptr<kv::BlockTable> table;
  int64_t prefilled_tokens = 0;
  absl::Time first_pass = absl::InfiniteFuture();
  int64_t compute_us = 0;
  int chunks = 0;
  absl::Time prefilled_at;
  bool joined_decode = false;
  int32_t last_token = -1;
  std::vector<int32_t> output;  // sampled tokens, in order
  int64_t cached_tokens = 0;    // of the prompt, taken from the prefix cache
  int generated = 0;    // output tokens so far
  int preemptions = 0;  // times its prefill was given up for a growing decode
  // params.prompt_logprobs: the prompt is computed whole (no cache hits) and scored.
  std::vector<model::SampledToken> prompt_logprobs;
  bool ScoresPrompt() const { return params.prompt_logprobs >= 0; }
};

struct ColocatedScheduler::Item {
  Request* request = nullptr;
  int64_t start = 0;  // first position of this step's tokens
  int64_t tokens = 0;
  bool decode = false;
  bool final = false;  // the prompt's last chunk (prefill) or always (decode): samples a token
};

// ---- Construction, Submit, Cancel, Load, Shutdown

ColocatedScheduler::ColocatedScheduler(ColocatedSchedulerOptions options,
                                       model::ModelRunner* runner, kv::BlockPool* pool)
    : options_(std::move(options)),
      runner_(runner),
      pool_(pool),
      kv_(pool, runner->PrefixCacheSeed(pool->layout().block_size),
          options_.enable_prefix_caching) {}

absl::StatusOr<std::unique_ptr<ColocatedScheduler>> ColocatedScheduler::Create(
    ColocatedSchedulerOptions options, model::ModelRunner* runner, kv::BlockPool* pool) {
  if (runner == nullptr || pool == nullptr) {
    return absl::InvalidArgumentError("ColocatedScheduler: runner and pool are required");
  }
  if (options.max_running < 1 || options.max_batch_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("ColocatedScheduler: max_running (",
                                                   options.max_running, ") and max_batch_tokens (",
                                                   options.max_batch_tokens, ") must be >= 1"));
  }
  if (options.max_batch_tokens < options.max_running) {
    return absl::InvalidArgumentError(
        absl::StrCat("ColocatedScheduler: max_batch_tokens (", options.max_batch_tokens,
                     ") must be >= max_running (", options.max_running,
                     "): every running decode takes one token of each step's budget"));
  }
  DUET_RETURN_IF_ERROR(kv::CheckLayoutsMatch(runner->MakeKvLayout(pool->layout().block_size),
                                             pool->layout(), "model", "KV pool"));
  std::unique_ptr<ColocatedScheduler> s(new ColocatedScheduler(std::move(options), runner, pool));
  {
    absl::MutexLock lock(&s->join_mu_);
    s->thread_ = std::thread([p = s.get()] { p->Loop(); });
  }
  return s;
}

ColocatedScheduler::~ColocatedScheduler() { Shutdown(); }

absl::StatusOr<std::shared_ptr<ColocatedStream>> ColocatedScheduler::Submit(SubmitArgs args) {
  const model::ModelConfig& c = runner_->config();
  const std::string what = absl::StrCat(options_.name, ": request ", args.request_id);
  DUET_RETURN_IF_ERROR(Annotate(c.CheckPrompt(args.prompt), what));
  const int64_t n = static_cast<int64_t>(args.prompt.size());
  DUET_RETURN_IF_ERROR(Annotate(args.sampling.Validate(c.vocab_size), what));
  const int64_t need = pool_->layout().BlocksForTokens(n + 1);
  if (need > pool_->num_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": a prompt of ", n, " tokens needs ",
                                                     need, " KV blocks but the pool holds ",
                                                     pool_->num_blocks()));
  }
  auto r = std::make_shared<Request>();
  r->id = std::move(args.request_id);
  r->prompt = std::move(args.prompt);
  r->params = std::move(args.sampling);
  r->sampling_state = model::SamplingState(r->params, options_.eos_ids, r->prompt, {});
  r->submitted = absl::Now();
  r->deadline = args.deadline == absl::InfiniteFuture() ? r->submitted + options_.default_deadline
                                                        : args.deadline;
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError(absl::StrCat(options_.name, " is shutting down"));
  if (by_id_.count(r->id))
    return absl::AlreadyExistsError(absl::StrCat(what, ": already in flight"));
  r->seq_id = next_seq_id_++;
  by_id_[r->id] = r;
  incoming_.push_back(r);
  ++load_.waiting_requests;
  load_.queued_tokens += n;
  wake_ = true;
  return r->stream;
}

bool ColocatedScheduler::Cancel(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  auto it = by_id_.find(request_id);
  if (it == by_id_.end()) return false;
  it->second->cancel_requested = true;
  wake_ = true;
  return true;
}

ColocatedLoad ColocatedScheduler::Load() const {
  const kv::BlockPoolStats stats = pool_->Stats();
  absl::MutexLock lock(&mu_);
  ColocatedLoad load = load_;
  load.free_blocks = stats.available();
  load.total_blocks = stats.total;
  return load;
}

void ColocatedScheduler::Shutdown() {
  absl::MutexLock join_lock(&join_mu_);
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();  // after its current step
  const absl::Status error =
      absl::UnavailableError(absl::StrCat(options_.name, " is shutting down"));
  {
    absl::MutexLock lock(&mu_);
    for (auto& r : incoming_) waiting_.push_back(std::move(r));
    incoming_.clear();
  }
  for (auto& r : active_) Fail(*r, error);
  for (auto& r : waiting_) Fail(*r, error);
  active_.clear();
  waiting_.clear();
  PublishLoad();
}

// ---- The scheduler thread

void ColocatedScheduler::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || wake_; };
      if (active_.empty()) {
        // Idle, or waiting for room: sleep until a submit or cancel (or the next check).
        mu_.AwaitWithTimeout(absl::Condition(&work), options_.idle_wait);
      }
      if (stopping_) return;
      wake_ = false;
    }
    Reap(absl::Now());
    Admit();
    std::vector<Item> items = BuildStep();
    if (!items.empty()) RunStep(items);
    RemoveDone();
    PublishLoad();
  }
}

void ColocatedScheduler::Reap(absl::Time now) {
  {
    absl::MutexLock lock(&mu_);
    for (auto& r : incoming_) waiting_.push_back(std::move(r));
    incoming_.clear();
  }
  auto check = [&](Request& r) {
    bool cancelled;
    {
      absl::MutexLock lock(&mu_);
      cancelled = r.cancel_requested;
    }
    if (cancelled) {
      Finish(r, ColocatedEvent{.finish = FinishReason::kCancelled});
    } else if (now >= r.deadline) {
      Fail(r, absl::DeadlineExceededError(absl::StrCat(
                  options_.name, ": request ", r.id, " passed its deadline (", r.generated,
                  " tokens generated, prompt of ", r.prompt.size(), ")")));
    } else if (r.phase == Phase::kWaiting && now - r.submitted >= options_.admission_timeout) {
      Fail(r, absl::ResourceExhaustedError(absl::StrCat(
                  options_.name, ": request ", r.id, " found no batch slot and KV room for ",
                  r.prompt.size(), " prompt tokens within ",
                  absl::FormatDuration(options_.admission_timeout))));
    }
  };
  for (auto& r : waiting_) check(*r);
  for (auto& r : active_) check(*r);
  RemoveDone();
}

void ColocatedScheduler::Admit() {
  while (!waiting_.empty() && static_cast<int>(active_.size()) < options_.max_running) {
    Request& r = *waiting_.front();
    const int64_t n = static_cast<int64_t>(r.prompt.size());
    // Room for the prompt, and headroom for the running ones (KvCacheManager::HasRoomToAdmit).
    const int64_t need = pool_->layout().BlocksForTokens(n);
    if (!kv_.HasRoomToAdmit(need, static_cast<int64_t>(active_.size()))) return;  // wait (FIFO)
    absl::StatusOr<kv::SequenceBlocks> blocks =
        kv_.AllocateSequence(r.prompt, n, /*use_cache=*/!r.ScoresPrompt());
    if (!blocks.ok()) return;  // wait for blocks to come back
    r.prompt_logprobs.clear();  // a preempted prefill starts over
    r.cached_tokens = blocks->cached_tokens;
    r.prefilled_tokens = r.cached_tokens;
    r.table = std::move(*blocks).MakeTable(pool_);
    r.phase = Phase::kPrefilling;
    active_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
}

std::vector<ColocatedScheduler::Item> ColocatedScheduler::BuildStep() {
  std::vector<Item> items;
  int64_t budget = options_.max_batch_tokens;
  // Decodes first: one token each (max_running <= max_batch_tokens, so they always fit).
  for (auto& rp : active_) {
    Request& r = *rp;
    if (r.done || r.phase != Phase::kDecoding || budget <= 0) continue;
    absl::Status s = r.table->Reserve(r.table->num_tokens() + 1);
    // Out of blocks: take them from the newest request still prefilling (it has produced no
    // token, so prefilling it again later changes nothing it will generate).
    while (!s.ok() && PreemptNewestPrefill()) s = r.table->Reserve(r.table->num_tokens() + 1);
    if (!s.ok()) {
      Fail(r, Annotate(s, absl::StrCat(options_.name, ": growing the KV of request ", r.id, " to ",
                                       r.table->num_tokens() + 1, " tokens")));
      continue;
    }
    items.push_back(Item{
        .request = &r, .start = r.table->num_tokens(), .tokens = 1, .decode = true, .final = true});
    --budget;
  }
  // Then prompt chunks, oldest admitted first.
  for (auto& rp : active_) {
    Request& r = *rp;
    if (r.done || r.phase != Phase::kPrefilling || budget <= 0) continue;
    const int64_t remaining = static_cast<int64_t>(r.prompt.size()) - r.prefilled_tokens;
    const int64_t n = std::min(remaining, budget);
    budget -= n;
    items.push_back(Item{.request = &r,
                         .start = r.prefilled_tokens,
                         .tokens = n,
                         .decode = false,
                         .final = n == remaining});
  }
  // Preempted requests go back to the head of the queue, in their order.
  std::vector<std::shared_ptr<Request>> kept, preempted;
  for (auto& rp : active_) (rp->phase == Phase::kWaiting ? preempted : kept).push_back(rp);
  if (!preempted.empty()) {
    active_ = std::move(kept);
    waiting_.insert(waiting_.begin(), preempted.begin(), preempted.end());
  }
  return items;
}

bool ColocatedScheduler::PreemptNewestPrefill() {
  for (auto it = active_.rbegin(); it != active_.rend(); ++it) {
    Request& r = **it;
    if (r.done || r.phase != Phase::kPrefilling) continue;
    if (absl::Status s = r.table->Release(); !s.ok()) {
      DUET_LOG(ERROR) << options_.name << ": request " << r.id << ": freeing its blocks: " << s;
    }
    r.table.reset();
    r.phase = Phase::kWaiting;
    r.prefilled_tokens = 0;
    r.cached_tokens = 0;
    r.first_pass = absl::InfiniteFuture();
    r.compute_us = 0;
    r.chunks = 0;
    ++r.preemptions;
    DUET_LOG(INFO) << options_.name << ": request " << r.id
                   << " preempted while prefilling (KV pool full, " << r.preemptions
                   << " times so far); it will start again";
    return true;
  }
  return false;
}

void ColocatedScheduler::RunStep(std::vector<Item>& items) {
  std::vector<model::SequenceInput> batch;
  batch.reserve(items.size());
  StepInfo info;
  for (const Item& it : items) {
    Request& r = *it.request;
    std::vector<int32_t> tokens =
        it.decode ? std::vector<int32_t>{r.last_token}
                  : std::vector<int32_t>(r.prompt.begin() + it.start,
                                         r.prompt.begin() + it.start + it.tokens);
    batch.push_back(model::SequenceInput{.seq_id = r.seq_id,
                                         .tokens = std::move(tokens),
                                         .start_pos = static_cast<int32_t>(it.start),
                                         .table = r.table.get(),
                                         .want_logits = false,
                                         .all_logits = !it.decode && r.ScoresPrompt(),
                                         .sample = it.final ? &r.params : nullptr,
                                         .sample_step = r.generated,
                                         .sample_state = &r.sampling_state});
    (it.decode ? info.decode_tokens : info.prefill_tokens) += it.tokens;
    info.request_ids.push_back(r.id);
    info.tokens.push_back(it.tokens);
    info.is_decode.push_back(it.decode);
    info.final_chunk.push_back(!it.decode && it.final);
  }
  if (options_.on_step) options_.on_step(info);

  const absl::Time t0 = absl::Now();
  for (const Item& it : items) {
    Request& r = *it.request;
    if (!it.decode && r.first_pass == absl::InfiniteFuture()) r.first_pass = t0;
  }
  absl::StatusOr<model::ForwardOutput> out = runner_->Forward(absl::MakeSpan(batch), pool_->View());
  const absl::Time t1 = absl::Now();
  if (!out.ok()) {
    for (const Item& it : items) {
      Fail(*it.request, Annotate(out.status(), absl::StrCat(options_.name, ": forward step")));
    }
    return;
  }
  // Each sequence's last row (its sampled token) and first row (a scored chunk's first).
  std::map<int64_t, size_t> rows, first_rows;
  for (size_t i = 0; i < out->seq_ids.size(); ++i) {
    rows[out->seq_ids[i]] = i;
    first_rows.emplace(out->seq_ids[i], i);
  }

  const model::ModelConfig& config = runner_->config();
  for (const Item& it : items) {
    Request& r = *it.request;
    if (!it.decode) {
      r.prefilled_tokens += it.tokens;
      r.compute_us += Micros(t1 - t0);
      ++r.chunks;
      kv_.Publish(*r.table, r.prompt);  // the blocks this chunk completed
      if (r.ScoresPrompt() && first_rows.contains(r.seq_id)) {
        model::ScorePromptChunk(out->Row(first_rows[r.seq_id]), out->vocab, it.tokens, it.start,
                                r.prompt, r.params.prompt_logprobs, &r.prompt_logprobs);
      }
      if (!it.final) continue;
    }
    auto row = rows.find(r.seq_id);
    if (row == rows.end()) {
      Fail(r, absl::InternalError(absl::StrCat(options_.name,
                                               ": the forward step returned no "
                                               "token for request ",
                                               r.id)));
      continue;
    }
    const int step = r.generated;  // index of this output token
    ColocatedEvent ev{.has_token = true, .index = step};
    ev.token = std::move(out->tokens.at(row->second));  // sampled on the backend at `step`
    ++r.generated;
    if (it.decode) {
      if (!r.joined_decode) {
        r.joined_decode = true;
        ev.joined_decode = true;
        ev.decode_admission_us = std::max<int64_t>(0, Micros(t0 - r.prefilled_at));
      }
    } else {
      r.prefilled_at = t1;
      ev.prefilled = true;
      ev.queue_us = std::max<int64_t>(0, Micros(r.first_pass - r.submitted));
      ev.prefill_compute_us = r.compute_us;
      ev.prefill_chunks = r.chunks;
      ev.cached_tokens = r.cached_tokens;
      ev.prompt_logprobs = std::move(r.prompt_logprobs);
    }
    r.output.push_back(ev.token.id);
    r.sampling_state.AddGenerated(ev.token.id);
    const model::StopReason stop =
        model::StopAfterToken(r.params, options_.eos_ids, ev.token.id, r.generated,
                              r.table->num_tokens(), config.max_position_embeddings);
    if (stop != model::StopReason::kNone) {
      ev.finish = engine::FinishReasonFromStop(stop);
      Finish(r, std::move(ev));
      continue;
    }
    r.phase = Phase::kDecoding;
    r.last_token = ev.token.id;
    r.stream->Push(std::move(ev));
  }
}

void ColocatedScheduler::PublishSequence(Request& r) {
  // Every token but the last sampled one has its K/V in the table.
  std::vector<int32_t> seq = r.prompt;
  seq.insert(seq.end(), r.output.begin(), r.output.end());
  kv_.Publish(*r.table, seq);
}

void ColocatedScheduler::Finish(Request& r, ColocatedEvent last) {
  if (r.done) return;
  r.done = true;
  if (r.table != nullptr) {
    // As the decode node: a stopped, cancelled or expired request's complete K/V stays in the
    // prefix cache (not after a failed step, whose K/V may be incomplete).
    if (last.finish != FinishReason::kError) PublishSequence(r);
    if (absl::Status s = r.table->Release(); !s.ok()) {
      DUET_LOG(ERROR) << options_.name << ": request " << r.id
                      << ": cannot free its blocks: " << s.message();
    }
    r.table.reset();
  }
  {
    absl::MutexLock lock(&mu_);
    auto it = by_id_.find(r.id);
    if (it != by_id_.end() && it->second.get() == &r) by_id_.erase(it);
  }
  r.stream->Push(std::move(last));
}

void ColocatedScheduler::Fail(Request& r, absl::Status error) {
  if (r.done) return;
  DUET_LOG(WARNING) << "request " << r.id << " failed: " << error.message();
  Finish(r, ColocatedEvent{.finish = FinishReason::kError, .error = std::move(error)});
}

void ColocatedScheduler::RemoveDone() {
  auto done = [](const std::shared_ptr<Request>& r) { return r->done; };
  waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(), done), waiting_.end());
  active_.erase(std::remove_if(active_.begin(), active_.end(), done), active_.end());
}

void ColocatedScheduler::PublishLoad() {
  ColocatedLoad load;
  for (const auto& r : waiting_) {
    ++load.waiting_requests;
    load.queued_tokens += static_cast<int64_t>(r->prompt.size());
  }
  for (const auto& r : active_) {
    ++load.running_requests;
    load.queued_tokens += static_cast<int64_t>(r->prompt.size()) - r->prefilled_tokens;
  }
  absl::MutexLock lock(&mu_);
  for (const auto& r : incoming_) {
    ++load.waiting_requests;
    load.queued_tokens += static_cast<int64_t>(r->prompt.size());
  }
  load_ = load;
}

}  // namespace duet::colocated
