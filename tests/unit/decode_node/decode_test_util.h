// Test harness for the decode node: a prefill side (P: a LocalEngine whose pool is registered
// with a transport, streaming KV with KvStreamSender exactly as a prefill node does) and a
// decode side (D: a DecodeScheduler over its own runner and an inproc-allocated pool), in one
// process. LocalEngine::Generate on P's engine is the single-process reference.
//
//   DecodeHarness h;  ASSERT_TRUE(h.Init({.d_blocks = 64}).ok());
//   auto res = h.scheduler().Reserve(h.Args("r1", prompt, params));
//   auto first = h.Prefill(prompt, params, *res);
//   auto events = DrainStream(*h.scheduler().Subscribe("r1"), absl::Seconds(10));
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/engine/local_engine.h"
#include "common/kv/block_pool.h"
#include "decode_node/decode_scheduler.h"
#include "transfer/kv_stream/kv_stream_sender.h"
#include "transfer/transport.h"

namespace duet::decode::testing {

// The tiny synthetic model, written once per process.
const std::string& TinyModelDir();

struct HarnessOptions {
  int block_size = 4;
  int64_t d_blocks = 256;
  int max_running = 64;
  absl::Duration release_wait = absl::Seconds(5);
  // DecodeSchedulerOptions::unclaimed_timeout.
  absl::Duration unclaimed_timeout = absl::Seconds(10);
  absl::Duration housekeeping_interval = absl::Seconds(1);
  // D's pool in its backend's KV memory and the transport region a host mirror of it that
  // admission copies from (the --kv_staging path), instead of the pool being the region.
  bool staged = false;
  // DecodeSchedulerOptions::kv_quarantine_bound.
  absl::Duration kv_quarantine_bound = absl::Seconds(10);
};

// The prefill side: a LocalEngine (also the single-process reference) whose KV pool is
// registered with a transport, and a KvStreamSender that streams layers as a prefill node does.
class PrefillSide {
 public:
  // `backend`: "inproc" or "ucx" (then `ucx_profile` picks the lanes).
  absl::Status Init(const std::string& backend, int block_size,
                    const std::string& ucx_profile = "shm");
  // Connects to the decode side's transfer address (the peer Prefill writes to).
  absl::Status ConnectTo(const std::string& decode_address);
  // Prefills `prompt` into the reservation and, when `layers_to_send` < 0, streams every layer
  // and the final notice (a serialized KvCompletion) and waits for the writes. Otherwise
  // streams only the first `layers_to_send` layers and leaves the request open. Returns the
  // first token (sampled here, at step 0). With `deferred_final`, every layer is streamed but
  // the final notice's payload is stored there instead of sent (send it with sender().Finish).
  absl::StatusOr<model::SampledToken> Prefill(const std::vector<int32_t>& prompt,
                                              const model::SamplingParams& params,
                                              const Reservation& reservation,
                                              int layers_to_send = -1,
                                              std::string* deferred_final = nullptr);
  absl::StatusOr<model::GenerationResult> Reference(const std::vector<int32_t>& prompt,
                                                    const model::SamplingParams& params);
  std::vector<int32_t> Encode(const std::string& text) const;

  transfer::KvStreamSender& sender() { return *sender_; }
  transfer::Transport& transport() { return *transport_; }
  transfer::PeerId to_d() const { return to_d_; }
  const kv::KvLayout& layout() const { return layout_; }
  const std::string& address() const { return address_; }

 private:
  std::unique_ptr<model::LocalEngine> engine_;
  kv::KvLayout layout_;
  std::unique_ptr<transfer::Transport> transport_;
  std::unique_ptr<transfer::MemoryRegion> region_;
  std::string address_;
  transfer::PeerId to_d_ = 0;
  std::unique_ptr<transfer::KvStreamSender> sender_;
};

// P (inproc) and D: a DecodeScheduler over its own runner and an inproc-allocated pool.
class DecodeHarness {
 public:
  absl::Status Init(const HarnessOptions& options);
  ~DecodeHarness();

  ReserveArgs Args(const std::string& id, const std::vector<int32_t>& prompt,
                   const model::SamplingParams& params,
                   absl::Duration kv_timeout = absl::Seconds(30)) const;
  absl::StatusOr<model::SampledToken> Prefill(const std::vector<int32_t>& prompt,
                                              const model::SamplingParams& params,
                                              const Reservation& reservation,
                                              int layers_to_send = -1,
                                              std::string* deferred_final = nullptr) {
    return p_.Prefill(prompt, params, reservation, layers_to_send, deferred_final);
  }
  absl::StatusOr<model::GenerationResult> Reference(const std::vector<int32_t>& prompt,
                                                    const model::SamplingParams& params) {
    return p_.Reference(prompt, params);
  }
  std::vector<int32_t> Encode(const std::string& text) const { return p_.Encode(text); }

  DecodeScheduler& scheduler() { return *scheduler_; }
  kv::BlockPool& d_pool() { return *d_pool_; }
  transfer::KvStreamSender& sender() { return p_.sender(); }
  transfer::Transport& p_transport() { return p_.transport(); }
  transfer::PeerId to_d() const { return p_.to_d(); }
  const kv::KvLayout& layout() const { return p_.layout(); }
  std::string p_address() const { return p_.address(); }
  const model::LocalEngine& d_engine() const { return *d_engine_; }

 private:
  // Declared in creation order.
  PrefillSide p_;
  std::unique_ptr<model::LocalEngine> d_engine_;
  std::unique_ptr<transfer::Transport> d_;
  std::unique_ptr<compute::KvMemory> d_pool_memory_;  // staged only
  std::unique_ptr<transfer::MemoryRegion> d_region_;
  std::unique_ptr<kv::BlockPool> d_pool_;
  std::unique_ptr<DecodeScheduler> scheduler_;
};

// Every event of `stream` up to and including the finishing one, or what came by `timeout`.
std::vector<DecodeEvent> DrainStream(TokenStream& stream, absl::Duration timeout);
// The token ids in `events` (by index), after `first`.
std::vector<int32_t> Tokens(int32_t first, const std::vector<DecodeEvent>& events);

}  // namespace duet::decode::testing
