#include "colocated/colocated_scheduler.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "common/grammar/grammar_constraint.h"

namespace duet::colocated {
namespace {

int64_t Micros(absl::Duration d) { return absl::ToInt64Microseconds(d); }

}  // namespace

// ---- Requests

struct ColocatedScheduler::Request {
  std::string id;
  absl::Time submitted;
  absl::Time deadline;
  std::shared_ptr<ColocatedStream> stream = std::make_shared<ColocatedStream>();
  // Guarded by mu_.
  bool cancel_requested = false;
  // Scheduler thread only (the sequence from Submit on, before the thread sees it).
  engine::Sequence seq;  // its table is null while it waits (first, or after a preemption)
  bool done = false;
  absl::Time queued_at;  // since when it waits for admission
  // The prompt's prefill, for the first token's event.
  absl::Time first_pass = absl::InfiniteFuture();
  int64_t compute_us = 0;
  int chunks = 0;
  absl::Time prefilled_at;
  bool joined_decode = false;
  int preemptions = 0;  // times its blocks were taken for a growing decode
  bool waiting() const { return seq.table == nullptr; }
};

struct ColocatedScheduler::Item {
  Request* request = nullptr;
  int64_t tokens = 0;
  bool decode = false;
  bool final = false;  // reaches the sequence's last token: samples one
};

// ---- Construction, Submit, Cancel, Load, Shutdown

ColocatedScheduler::ColocatedScheduler(ColocatedSchedulerOptions options,
                                       model::ModelRunner* runner, kv::BlockPool* pool)
    : options_(std::move(options)),
      runner_(runner),
      pool_(pool),
      kv_(pool, runner->PrefixCacheSeed(pool->layout().block_size), options_.enable_prefix_caching),
      step_(runner, &kv_, options_.eos_ids) {}

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
  r->seq = engine::Sequence(/*id=*/0, std::move(args.prompt), /*generated_before=*/0,
                            std::move(args.sampling), options_.eos_ids);
  // Structured output: compiled here, on the caller's thread, never on the scheduler's. A
  // preempted request keeps its constraint (its tokens stay; only its KV goes).
  absl::StatusOr<std::unique_ptr<model::TokenConstraint>> constraint =
      grammar::ConstraintFor(options_.grammar, r->seq.params, r->seq.given_output());
  if (!constraint.ok()) return Annotate(constraint.status(), what);
  r->seq.constraint = *std::move(constraint);
  r->submitted = absl::Now();
  r->queued_at = r->submitted;
  r->deadline = args.deadline == absl::InfiniteFuture() ? r->submitted + options_.default_deadline
                                                        : args.deadline;
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError(absl::StrCat(options_.name, " is shutting down"));
  if (by_id_.count(r->id))
    return absl::AlreadyExistsError(absl::StrCat(what, ": already in flight"));
  r->seq.id = next_seq_id_++;
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
                  options_.name, ": request ", r.id, " passed its deadline (", r.seq.generated(),
                  " tokens generated, prompt of ", r.seq.prompt_len, ")")));
    } else if (r.waiting() && now - r.queued_at >= options_.admission_timeout) {
      Fail(r, absl::ResourceExhaustedError(absl::StrCat(
                  options_.name, ": request ", r.id, " found no batch slot and KV room for ",
                  r.seq.tokens.size(), " tokens (a prompt of ", r.seq.prompt_len, " and ",
                  r.seq.generated(), " generated) within ",
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
    // Its prompt, and after a preemption every token it generated: all computed again (mostly
    // prefix-cache hits: its complete blocks were published when it was preempted).
    engine::Sequence& seq = r.seq;
    const int64_t n = static_cast<int64_t>(seq.tokens.size());
    // Room for them, and headroom for the running ones (KvCacheManager::HasRoomToAdmit).
    const int64_t need = pool_->layout().BlocksForTokens(n);
    if (!kv_.HasRoomToAdmit(need, static_cast<int64_t>(active_.size()))) return;  // wait (FIFO)
    absl::StatusOr<kv::SequenceBlocks> blocks =
        kv_.AllocateSequence(seq.tokens, n, /*use_cache=*/!seq.ScoresPrompt());
    if (!blocks.ok()) return;     // wait for blocks to come back
    seq.prompt_logprobs.clear();  // a preempted prefill scores its prompt again
    seq.cached_tokens = blocks->cached_tokens;
    seq.table = std::move(*blocks).MakeTable(pool_);
    r.stream->Push({.running = true});
    active_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
}

void ColocatedScheduler::GrowOrPreempt() {
  // Every running request is a claim, oldest first, so that the newest can be preempted; only a
  // decode needs more room (a prefill got room for all its tokens at admission).
  std::vector<kv::GrowthClaim> claims;
  claims.reserve(active_.size());
  for (const auto& rp : active_) {
    const engine::Sequence& seq = rp->seq;
    claims.push_back(kv::GrowthClaim{.table = seq.table.get(),
                                     .total_tokens = seq.computed() + (seq.decoding() ? 1 : 0),
                                     .tokens = seq.tokens});
  }
  std::vector<std::shared_ptr<Request>> preempted;  // newest first
  const size_t kept = kv_.GrowOrPreempt(claims, [&](const kv::Preemption& p) {
    const std::shared_ptr<Request>& victim = active_[p.victim];
    Request& r = *victim;
    r.seq.table.reset();  // its blocks are published and freed
    const kv::BlockPoolStats stats = pool_->Stats();
    if (p.victim == p.claimer && p.victim == 0) {
      // Alone, it still cannot grow: the pool can never hold it.
      Fail(r, Annotate(p.why,
                       absl::StrCat(options_.name, ": request ", r.id, " cannot grow to ",
                                    r.seq.tokens.size(), " tokens: the KV pool holds ", stats.total,
                                    " blocks of ", pool_->layout().block_size, " tokens")));
      return;
    }
    ++r.preemptions;
    ++preemptions_;
    r.stream->Push({.running = false});
    r.queued_at = absl::Now();
    if (r.seq.generated() == 0) {
      // Its prompt's prefill starts over.
      r.first_pass = absl::InfiniteFuture();
      r.compute_us = 0;
      r.chunks = 0;
    }
    DUET_LOG(INFO) << options_.name << ": preempting request " << r.id << " (" << p.freed_blocks
                   << " blocks, " << r.seq.generated() << " tokens generated, " << r.preemptions
                   << " preemptions so far) for request " << active_[p.claimer]->id
                   << ": the KV pool cannot grow it (" << stats.available() << " of " << stats.total
                   << " blocks available after the preemption); it resumes once there is room";
    preempted.push_back(victim);
  });
  active_.resize(kept);
  // Back to the head of the queue, oldest first.
  for (auto& r : preempted) {
    if (!r->done) waiting_.push_front(std::move(r));
  }
}

std::vector<ColocatedScheduler::Item> ColocatedScheduler::BuildStep() {
  GrowOrPreempt();
  std::vector<Item> items;
  int64_t budget = options_.max_batch_tokens;
  // Decodes first: one token each (max_running <= max_batch_tokens, so they always fit).
  for (auto& rp : active_) {
    Request& r = *rp;
    if (r.done || !r.seq.decoding() || budget <= 0) continue;
    items.push_back(Item{.request = &r, .tokens = 1, .decode = true, .final = true});
    --budget;
  }
  // Then chunks of prompts (and of resumed sequences), oldest admitted first.
  for (auto& rp : active_) {
    Request& r = *rp;
    if (r.done || r.seq.decoding() || budget <= 0) continue;
    const int64_t remaining = r.seq.pending();
    const int64_t n = std::min(remaining, budget);
    budget -= n;
    items.push_back(Item{.request = &r, .tokens = n, .decode = false, .final = n == remaining});
  }
  return items;
}

void ColocatedScheduler::RunStep(std::vector<Item>& items) {
  std::vector<engine::StepItem> step;
  step.reserve(items.size());
  StepInfo info;
  for (const Item& it : items) {
    Request& r = *it.request;
    step.push_back(engine::StepItem{.seq = &r.seq, .tokens = it.tokens});
    (it.decode ? info.decode_tokens : info.prefill_tokens) += it.tokens;
    info.request_ids.push_back(r.id);
    info.tokens.push_back(it.tokens);
    info.is_decode.push_back(it.decode);
    info.final_chunk.push_back(!it.decode && it.final);
  }
  if (options_.on_step) options_.on_step(info);

  // The prompt's own prefill (before its first token), for that token's event.
  std::vector<bool> prefills(items.size());
  const absl::Time t0 = absl::Now();
  for (size_t i = 0; i < items.size(); ++i) {
    Request& r = *items[i].request;
    prefills[i] = r.seq.generated() == 0;
    if (prefills[i] && r.first_pass == absl::InfiniteFuture()) r.first_pass = t0;
  }
  absl::StatusOr<std::vector<engine::StepOutcome>> out = step_.Run(step);
  const absl::Time t1 = absl::Now();
  if (!out.ok()) {
    for (const Item& it : items) {
      Fail(*it.request, Annotate(out.status(), absl::StrCat(options_.name, ": forward step")));
    }
    return;
  }
  for (size_t i = 0; i < items.size(); ++i) {
    Request& r = *items[i].request;
    engine::StepOutcome& o = (*out)[i];
    if (prefills[i]) {
      r.compute_us += Micros(t1 - t0);
      ++r.chunks;
    }
    if (!o.error.ok()) {
      Fail(r, Annotate(o.error, absl::StrCat(options_.name, ": forward step")));
      continue;
    }
    if (!o.sampled) continue;
    ColocatedEvent ev{.has_token = true, .index = r.seq.generated() - 1};
    ev.token = std::move(o.token);  // sampled on the backend at step `index`
    if (prefills[i]) {
      r.prefilled_at = t1;
      ev.prefilled = true;
      ev.queue_us = std::max<int64_t>(0, Micros(r.first_pass - r.submitted));
      ev.prefill_compute_us = r.compute_us;
      ev.prefill_chunks = r.chunks;
      ev.cached_tokens = r.seq.cached_tokens;
      ev.prompt_logprobs = std::move(r.seq.prompt_logprobs);
    } else if (!r.joined_decode) {
      r.joined_decode = true;
      ev.joined_decode = true;
      ev.decode_admission_us = std::max<int64_t>(0, Micros(t0 - r.prefilled_at));
    }
    if (o.stop != model::StopReason::kNone) {
      ev.finish = engine::FinishReasonFromStop(o.stop);
      Finish(r, std::move(ev));
      continue;
    }
    r.stream->Push(std::move(ev));
  }
}

void ColocatedScheduler::Finish(Request& r, ColocatedEvent last) {
  if (r.done) return;
  r.done = true;
  if (r.seq.table != nullptr) {
    // As the decode node: a stopped, cancelled or expired request's complete K/V stays in the
    // prefix cache (not after a failed step, whose K/V may be incomplete).
    kv_.Finish(*r.seq.table, r.seq.tokens, /*publish=*/last.finish != FinishReason::kError);
    r.seq.table.reset();
  }
  {
    absl::MutexLock lock(&mu_);
    auto it = by_id_.find(r.id);
    if (it != by_id_.end() && it->second.get() == &r) by_id_.erase(it);
  }
  last.preemptions = r.preemptions;
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
  ColocatedLoad load{.preemptions = preemptions_};
  // Tokens to compute before each request's next token (its pending ones, but for a decode).
  for (const auto& r : waiting_) {
    ++load.waiting_requests;
    load.queued_tokens += static_cast<int64_t>(r->seq.tokens.size());
  }
  for (const auto& r : active_) {
    ++load.running_requests;
    if (!r->seq.decoding()) load.queued_tokens += r->seq.pending();
  }
  absl::MutexLock lock(&mu_);
  for (const auto& r : incoming_) {
    ++load.waiting_requests;
    load.queued_tokens += static_cast<int64_t>(r->seq.tokens.size());
  }
  load_ = load;
}

}  // namespace duet::colocated
