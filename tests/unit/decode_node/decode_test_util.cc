#include "tests/unit/decode_node/decode_test_util.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/base/clock.h"
#include "common/base/status.h"
#include "common/kv/block_table.h"
#include "common/model/synthetic_model.h"
#include "duet/v1/decode.pb.h"
#include "transfer/ucx/ucx_transport.h"

namespace duet::decode::testing {

const std::string& TinyModelDir() {
  static const std::string* dir = [] {
    const char* tmp = std::getenv("TEST_TMPDIR");
    auto* d = new std::string(
        absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/duet_decode_tiny_", getpid()));
    absl::Status s = model::WriteSyntheticModel("tiny", /*seed=*/11, *d);
    if (!s.ok()) std::abort();
    return d;
  }();
  return *dir;
}

absl::Status PrefillSide::Init(const std::string& backend, int block_size,
                               const std::string& ucx_profile) {
  DUET_ASSIGN_OR_RETURN(engine_,
                        model::LocalEngine::Load(TinyModelDir(), {.device = compute::Device::kCpu,
                                                                  .num_threads = 1,
                                                                  .block_size = block_size,
                                                                  .kv_cache_bytes = 4 << 20}));
  layout_ = engine_->runner().MakeKvLayout(block_size);
  transfer::TransportOptions options{.name = "prefill-0", .layout = layout_};
  if (backend == "ucx") {
    DUET_ASSIGN_OR_RETURN(transfer::UcxProfile profile, transfer::UcxProfileByName(ucx_profile));
    options.tls = profile.tls;
    options.net_devices = profile.net_devices;
  }
  DUET_ASSIGN_OR_RETURN(transport_, transfer::CreateTransport(backend, options));
  DUET_ASSIGN_OR_RETURN(
      region_, transport_->Register(engine_->pool().region(), engine_->pool().region_bytes()));
  DUET_ASSIGN_OR_RETURN(address_, transport_->LocalAddress());
  DUET_ASSIGN_OR_RETURN(sender_, transfer::KvStreamSender::Create(transport_.get(), layout_,
                                                                  engine_->pool().num_blocks()));
  return absl::OkStatus();
}

absl::Status PrefillSide::ConnectTo(const std::string& decode_address) {
  DUET_ASSIGN_OR_RETURN(to_d_, transport_->Connect(decode_address, DeadlineIn(absl::Seconds(5))));
  return absl::OkStatus();
}

absl::StatusOr<model::SampledToken> PrefillSide::Prefill(const std::vector<int32_t>& prompt,
                                                         const model::SamplingParams& params,
                                                         const Reservation& reservation,
                                                         int layers_to_send,
                                                         std::string* deferred_final) {
  kv::BlockTable table(&engine_->pool());
  DUET_RETURN_IF_ERROR(table.Reserve(static_cast<int64_t>(prompt.size())));
  DUET_RETURN_IF_ERROR(
      sender_->Begin({.request_id = reservation.transfer_id,
                      .peer = to_d_,
                      // D holds the first cached_blocks blocks already.
                      .local_blocks = std::vector<kv::BlockId>(
                          table.blocks().begin() + reservation.cached_blocks, table.blocks().end()),
                      .remote_blocks = reservation.blocks}));
  std::vector<int64_t> layer_done_us;
  absl::Status hook_status;
  std::vector<model::SequenceInput> batch = {
      {.seq_id = 0, .tokens = prompt, .start_pos = 0, .table = &table, .want_logits = true}};
  DUET_ASSIGN_OR_RETURN(
      model::ForwardOutput out,
      engine_->runner().Forward(absl::MakeSpan(batch), engine_->pool().View(),
                                [&](int layer, absl::Span<const model::LayerSpan>) {
                                  layer_done_us.push_back(absl::ToUnixMicros(absl::Now()));
                                  if (layers_to_send < 0 || layer < layers_to_send) {
                                    hook_status.Update(
                                        sender_->OnLayerDone(layer, {reservation.transfer_id}));
                                  }
                                }));
  DUET_RETURN_IF_ERROR(hook_status);
  model::SampledToken first = model::Sample(out.Row(0), out.vocab, params, /*step=*/0);
  if (layers_to_send >= 0) return first;
  v1::KvCompletion completion;
  completion.set_first_token_id(first.id);
  completion.set_logprob(first.logprob);
  completion.set_prompt_tokens(static_cast<int32_t>(prompt.size()));
  completion.set_last_layer_done_unix_us(layer_done_us.back());
  for (int64_t us : layer_done_us) completion.add_layer_done_unix_us(us);
  completion.set_forward_done_unix_us(absl::ToUnixMicros(absl::Now()));
  if (deferred_final != nullptr) {
    *deferred_final = completion.SerializeAsString();
    return first;
  }
  DUET_RETURN_IF_ERROR(sender_->Finish(reservation.transfer_id, completion.SerializeAsString()));
  DUET_RETURN_IF_ERROR(sender_->Wait(reservation.transfer_id, DeadlineIn(absl::Seconds(5))));
  return first;
}

absl::StatusOr<model::GenerationResult> PrefillSide::Reference(
    const std::vector<int32_t>& prompt, const model::SamplingParams& params) {
  return engine_->Generate(prompt, params);
}

std::vector<int32_t> PrefillSide::Encode(const std::string& text) const {
  return *engine_->tokenizer().Encode(text, /*add_bos=*/true);
}

absl::Status DecodeHarness::Init(const HarnessOptions& o) {
  DUET_RETURN_IF_ERROR(p_.Init("inproc", o.block_size));
  DUET_ASSIGN_OR_RETURN(d_engine_,
                        model::LocalEngine::Load(TinyModelDir(), {.device = compute::Device::kCpu,
                                                                  .num_threads = 1,
                                                                  .block_size = o.block_size,
                                                                  .kv_cache_bytes = 1}));
  const kv::KvLayout& layout = p_.layout();
  DUET_ASSIGN_OR_RETURN(
      d_, transfer::CreateTransport("inproc", {.name = "decode-0", .layout = layout}));
  const size_t bytes = layout.RegionBytes(o.d_blocks);
  DUET_ASSIGN_OR_RETURN(d_region_, d_->AllocateRegion(bytes));
  kv::KvCacheView mirror;
  void* pool_base = d_region_->base();
  if (o.staged) {
    DUET_ASSIGN_OR_RETURN(d_pool_memory_, d_engine_->backend().AllocateKvMemory(bytes));
    pool_base = d_pool_memory_->data();
    mirror = kv::KvCacheView{layout, d_region_->base(), o.d_blocks};
  }
  DUET_ASSIGN_OR_RETURN(d_pool_, kv::BlockPool::CreateOver(layout, o.d_blocks, pool_base, bytes));
  DUET_ASSIGN_OR_RETURN(std::string d_address, d_->LocalAddress());
  DUET_RETURN_IF_ERROR(p_.ConnectTo(d_address));
  DUET_ASSIGN_OR_RETURN(scheduler_,
                        DecodeScheduler::Create({.name = "decode-0",
                                                 .max_running = o.max_running,
                                                 .eos_ids = d_engine_->tokenizer().eos_ids(),
                                                 .finished_linger = absl::Seconds(30),
                                                 .unclaimed_timeout = o.unclaimed_timeout,
                                                 .housekeeping_interval = o.housekeeping_interval,
                                                 .idle_wait = absl::Milliseconds(2),
                                                 .release_wait = o.release_wait,
                                                 .host_mirror = mirror,
                                                 .kv_quarantine_bound = o.kv_quarantine_bound},
                                                &d_engine_->runner(), d_pool_.get(), d_.get()));
  return absl::OkStatus();
}

DecodeHarness::~DecodeHarness() { scheduler_.reset(); }

ReserveArgs DecodeHarness::Args(const std::string& id, const std::vector<int32_t>& prompt,
                                const model::SamplingParams& params,
                                absl::Duration kv_timeout) const {
  return ReserveArgs{.request_id = id,
                     .num_tokens = static_cast<int64_t>(prompt.size()),
                     .prompt = prompt,
                     .sampling = params,
                     .expected_layout = p_.layout(),
                     .sender_name = "prefill-0",
                     .sender_address = p_.address(),
                     .deadline = DeadlineIn(kv_timeout)};
}

std::vector<DecodeEvent> DrainStream(TokenStream& stream, absl::Duration timeout) {
  std::vector<DecodeEvent> all;
  const absl::Time deadline = DeadlineIn(timeout);
  while (absl::Now() < deadline) {
    for (DecodeEvent& e : stream.Pop(deadline)) {
      all.push_back(std::move(e));
      if (all.back().finished()) return all;
    }
  }
  return all;
}

std::vector<int32_t> Tokens(int32_t first, const std::vector<DecodeEvent>& events) {
  std::vector<int32_t> out = {first};
  for (const DecodeEvent& e : events) {
    if (e.has_token) out.push_back(e.token.id);
  }
  return out;
}


}  // namespace duet::decode::testing
