#include "transfer/ucx/ucx_transport.h"

#include <poll.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/clock.h"
#include "common/base/enum_names.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "transfer/peer_address.h"
#include "transfer/ucx/ucx_handles.h"
#include "transfer/ucx/ucx_transport_internal.h"

namespace duet::transfer::ucx_internal {

// ---------------------------------------------------------------------------------------------
// Setup and teardown.

UcxTransport::UcxTransport(const TransportOptions& options)
    : options_(options), instance_(NewInstanceId()) {}

absl::StatusOr<std::unique_ptr<Transport>> UcxTransport::Create(const TransportOptions& options) {
  std::unique_ptr<UcxTransport> t(new UcxTransport(options));
  if (absl::Status s = t->Init(); !s.ok()) {
    return Annotate(s, absl::StrCat("ucx transport '", options.name, "'"));
  }
  return std::unique_ptr<Transport>(std::move(t));
}

absl::Status UcxTransport::Init() {
  constexpr uint64_t kMinChunk = 4 << 10;
  constexpr uint64_t kMaxChunk = uint64_t{1} << 30;
  for (const auto& [name, bytes] :
       {std::pair<const char*, uint64_t>{"chunk_bytes", options_.chunk_bytes},
        {"am_chunk_bytes", options_.am_chunk_bytes}}) {
    if (bytes < kMinChunk || bytes > kMaxChunk) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " must be in [4 KiB, 1 GiB], got ", bytes, " bytes"));
    }
  }
  if (options_.keepalive <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("keepalive must be positive, got ", absl::FormatDuration(options_.keepalive)));
  }
  // tcp connects without blocking the progress thread: with UCX's default a connect to an
  // unreachable peer (a black-holed link, a fence's re-ask) holds the worker, and every other
  // peer's transfers with it, in connect() through the kernel's SYN retries (up to minutes),
  // and a connect made after the link returns waits for the next retry. UCX reads this
  // transport setting from the environment only (ucp_config_modify does not reach it); one set
  // by the user still decides. Transports are created at startup, before other threads read
  // the environment.
  setenv("UCX_TCP_CONN_NB", "y", /*overwrite=*/0);
  ucp_config_t* raw_config = nullptr;
  DUET_UCX_RETURN_IF_ERROR(ucp_config_read(nullptr, nullptr, &raw_config));
  ucx::ConfigPtr config(raw_config);
  if (!options_.tls.empty())
    DUET_UCX_RETURN_IF_ERROR(ucp_config_modify(config.get(), "TLS", options_.tls.c_str()));
  if (!options_.net_devices.empty()) {
    DUET_UCX_RETURN_IF_ERROR(
        ucp_config_modify(config.get(), "NET_DEVICES", options_.net_devices.c_str()));
  }
  const std::string keepalive = absl::StrCat(absl::ToInt64Milliseconds(options_.keepalive), "ms");
  DUET_UCX_RETURN_IF_ERROR(
      ucp_config_modify(config.get(), "KEEPALIVE_INTERVAL", keepalive.c_str()));

  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 1;  // Register/unmap run on caller threads
  ucp_context_h context = nullptr;
  DUET_UCX_RETURN_IF_ERROR(ucp_init(&params, config.get(), &context));
  ctx_ = std::make_shared<ContextHolder>(ContextHolder{ucx::ContextPtr(context)});
  // Which memory types this UCX can reach: GPU pools need a CUDA-aware UCX (Debian's is not);
  // without one, callers must stage device KV through host memory.
  ucp_context_attr_t cattr{};
  cattr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  DUET_UCX_RETURN_IF_ERROR(ucp_context_query(context, &cattr));
  cuda_memory_ = (cattr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;

  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h worker = nullptr;
  DUET_UCX_RETURN_IF_ERROR(ucp_worker_create(context, &wparams, &worker));
  worker_.reset(worker);

  ucp_address_t* address = nullptr;
  size_t address_len = 0;
  DUET_UCX_RETURN_IF_ERROR(ucp_worker_get_address(worker, &address, &address_len));
  worker_address_.assign(reinterpret_cast<const char*>(address), address_len);
  ucp_worker_release_address(worker, address);
  DUET_UCX_RETURN_IF_ERROR(ucp_worker_get_efd(worker, &efd_));

  for (unsigned id : {kAmData, kAmNotice}) {
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                    UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.id = id;
    hp.flags = UCP_AM_FLAG_WHOLE_MSG;
    hp.cb = id == kAmData ? &UcxTransport::OnData : &UcxTransport::OnNotice;
    hp.arg = this;
    DUET_UCX_RETURN_IF_ERROR(ucp_worker_set_am_recv_handler(worker, &hp));
  }
  {
    absl::MutexLock lock(&waker_->mu);
    waker_->worker = worker;
  }
  // The worker only runs queued calls, and none can be queued before Create returns, so
  // worker_tid_ is written before any RunOnWorker reads it.
  thread_ = std::thread([this] { Loop(); });
  worker_tid_ = thread_.get_id();
  return absl::OkStatus();
}

UcxTransport::~UcxTransport() {
  if (thread_.joinable()) {
    {
      absl::MutexLock lock(&queue_mu_);
      stop_ = true;
    }
    waker_->Signal();
    thread_.join();
  }
  absl::MutexLock lock(&waker_->mu);
  waker_->worker = nullptr;
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> UcxTransport::Map(void* base, size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("ucx: cannot register an empty region");
  {
    absl::MutexLock lock(&slot_->mu);
    if (slot_->base != nullptr) {
      return absl::AlreadyExistsError(
          absl::StrCat("ucx transport '", options_.name, "' already exports a region"));
    }
  }
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                  UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  mp.address = base;
  mp.length = bytes;
  mp.flags = base == nullptr ? UCP_MEM_MAP_ALLOCATE : 0;
  ucp_mem_h raw = nullptr;
  DUET_UCX_RETURN_IF_ERROR(ucp_mem_map(ctx_->context.get(), &mp, &raw));
  ucx::MemPtr memh(raw, ucx::MemDeleter{ctx_->context.get()});
  if (base == nullptr) {
    ucp_mem_attr_t attr{};
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    DUET_UCX_RETURN_IF_ERROR(ucp_mem_query(memh.get(), &attr));
    base = attr.address;
    std::memset(base, 0, bytes);
  }
  void* rkey_buf = nullptr;
  size_t rkey_len = 0;
  DUET_UCX_RETURN_IF_ERROR(ucp_rkey_pack(ctx_->context.get(), memh.get(), &rkey_buf, &rkey_len));
  std::string rkey(static_cast<const char*>(rkey_buf), rkey_len);
  ucp_rkey_buffer_release(rkey_buf);
  {
    absl::MutexLock lock(&slot_->mu);
    slot_->base = static_cast<uint8_t*>(base);
    slot_->bytes = bytes;
    slot_->rkey = std::move(rkey);
  }
  return std::unique_ptr<MemoryRegion>(new UcxRegion(ctx_, std::move(memh), slot_, base, bytes));
}

absl::StatusOr<std::string> UcxTransport::LocalAddress() {
  PeerAddress a{
      .backend = "ucx", .name = options_.name, .instance = instance_, .layout = options_.layout};
  {
    absl::MutexLock lock(&slot_->mu);
    if (slot_->base == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ucx transport '", options_.name, "': register a region before LocalAddress"));
    }
    a.region_base = reinterpret_cast<uint64_t>(slot_->base);
    a.region_bytes = slot_->bytes;
    a.region_key = slot_->rkey;
  }
  a.worker_address = worker_address_;
  a.write_mode = WriteModeName(options_.write_mode);
  FillProcessIdentity(a);
  return EncodePeerAddress(a);
}

// ---------------------------------------------------------------------------------------------
// Peers.

absl::StatusOr<PeerId> UcxTransport::Connect(const std::string& blob, absl::Time deadline) {
  DUET_ASSIGN_OR_RETURN(PeerAddress a, DecodePeerAddress(blob));
  if (a.backend != "ucx") {
    return absl::InvalidArgumentError(absl::StrCat(
        "ucx transport '", options_.name, "' cannot connect to '", a.name, "' (", a.backend, ")"));
  }
  DUET_RETURN_IF_ERROR(kv::CheckLayoutsMatch(options_.layout, a.layout, options_.name, a.name));
  if (a.region_key.empty() || a.worker_address.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("peer '", a.name, "' sent no ucx address"));
  }
  PeerId id;
  {
    absl::MutexLock lock(&peers_mu_);
    auto it = peer_by_instance_.find(a.instance);
    if (it != peer_by_instance_.end() && !peers_[it->second]->closed &&
        peers_[it->second]->status.ok()) {
      return it->second;
    }
    id = next_peer_++;
  }
  // A peer on this host whose process is gone cannot answer: say so now rather than at the
  // deadline.
  if (!PeerProcessAlive(a)) {
    return absl::UnavailableError(absl::StrCat("ucx transport '", options_.name,
                                               "' connecting to '", a.name, "': its process (pid ",
                                               a.pid, ") has exited"));
  }
  absl::Status s = RunOnWorkerAsync(
      [this, a, id, deadline](std::function<void(absl::Status)> done) {
        BeginConnect(a, id, deadline, std::move(done));
      },
      deadline);
  if (!s.ok()) {
    return Annotate(
        s, absl::StrCat("ucx transport '", options_.name, "' connecting to '", a.name, "'"));
  }
  return id;
}

void UcxTransport::BeginConnect(const PeerAddress& a, PeerId id, absl::Time deadline,
                                std::function<void(absl::Status)> done) {
  PendingConnect pc{.deadline = deadline, .done = std::move(done)};
  absl::Status s = StartConnect(pc, a, id);
  if (!s.ok()) {
    if (pc.conn != nullptr && pc.conn->ep != nullptr) pc.conn->ep.get_deleter().force = true;
    pc.conn.reset();
    pc.done(std::move(s));
    return;
  }
  if (pc.flush == nullptr) {
    pc.done(FinishConnect(std::move(pc.conn)));
    return;
  }
  connecting_.push_back(std::move(pc));
}

absl::Status UcxTransport::StartConnect(PendingConnect& pc, const PeerAddress& a, PeerId id) {
  pc.conn = std::make_unique<PeerConn>();
  PeerConn* conn = pc.conn.get();
  conn->owner = this;
  conn->id = id;
  conn->meta = std::make_shared<PeerMeta>();
  conn->meta->address = a;

  // UCX 1.13's shm transports cannot do UCP_ERR_HANDLING_MODE_PEER; there the watchdog detects
  // a dead peer instead. Try PEER first unless our TLS list is all shared memory.
  bool shm_only = !options_.tls.empty() && !absl::StrContains(options_.tls, "tcp") &&
                  !absl::StrContains(options_.tls, "rc") &&
                  !absl::StrContains(options_.tls, "dc") &&
                  !absl::StrContains(options_.tls, "ud") && !absl::StrContains(options_.tls, "all");
  ucs_status_t create_status = UCS_ERR_UNREACHABLE;
  ucp_ep_h ep = nullptr;
  for (bool peer_mode : {true, false}) {
    if (peer_mode && shm_only) continue;
    ucp_ep_params_t ep_params{};
    ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                           UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep_params.address = reinterpret_cast<const ucp_address_t*>(a.worker_address.data());
    ep_params.err_mode = peer_mode ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    ep_params.err_handler.cb = &UcxTransport::OnEpError;
    ep_params.err_handler.arg = conn;
    create_status = ucp_ep_create(worker_.get(), &ep_params, &ep);
    if (create_status == UCS_OK) {
      conn->peer_err_mode = peer_mode;
      break;
    }
  }
  DUET_UCX_RETURN_IF_ERROR(create_status);
  conn->ep = ucx::EpPtr(ep, ucx::EpDeleter{worker_.get(), false});
  ucp_rkey_h rkey = nullptr;
  DUET_UCX_RETURN_IF_ERROR(ucp_ep_rkey_unpack(ep, a.region_key.data(), &rkey));
  conn->rkey.reset(rkey);

  // Flush: completes wireup (so the lane table is final) and proves the peer reachable. The
  // progress loop waits for it (AdvanceConnects), never this call.
  ucp_request_param_t fp{};
  ucs_status_ptr_t req = ucp_ep_flush_nbx(ep, &fp);
  if (UCS_PTR_IS_ERR(req)) DUET_UCX_RETURN_IF_ERROR(UCS_PTR_STATUS(req));
  pc.flush = req;
  return absl::OkStatus();
}

bool UcxTransport::AdvanceConnects() {
  const absl::Time now = absl::Now();
  for (auto it = connecting_.begin(); it != connecting_.end();) {
    PendingConnect& pc = *it;
    const ucs_status_t st = ucp_request_check_status(pc.flush);
    if (st == UCS_INPROGRESS && now < pc.deadline) {
      ++it;
      continue;
    }
    // Freed now if complete, else by UCX once the force-close below cancels it.
    ucp_request_free(pc.flush);
    absl::Status result;
    if (st == UCS_INPROGRESS) {
      result = absl::DeadlineExceededError(absl::StrCat(
          "peer '", pc.conn->meta->address.name, "' did not answer the endpoint flush in time"));
    } else if (st != UCS_OK) {
      result = ucx::UcxError(st, "ucp_ep_flush_nbx (connect)", __FILE__, __LINE__);
    }
    if (result.ok()) {
      result = FinishConnect(std::move(pc.conn));
    } else {
      // Unreachable or silent: nothing was sent on it, so close without a graceful flush.
      pc.conn->ep.get_deleter().force = true;
      pc.conn.reset();
    }
    std::function<void(absl::Status)> done = std::move(pc.done);
    it = connecting_.erase(it);
    done(std::move(result));
  }
  return !connecting_.empty();
}

absl::Status UcxTransport::FinishConnect(std::unique_ptr<PeerConn> conn) {
  const PeerAddress& a = conn->meta->address;
  const PeerId id = conn->id;
  ucp_ep_h ep = conn->ep.get();
  ucp_rkey_h rkey = conn->rkey.get();
  // Lane: put where the endpoint has a native RMA lane or the remote region is mapped here.
  char* info = nullptr;
  size_t info_len = 0;
  FILE* stream = open_memstream(&info, &info_len);
  if (stream != nullptr) {
    ucp_ep_print_info(ep, stream);
    std::fclose(stream);
  }
  const std::string ep_info = info != nullptr ? std::string(info, info_len) : std::string();
  std::free(info);
  void* mapped = nullptr;
  const bool has_rma_lane = absl::StrContains(ep_info, "rma_bw#");
  const bool is_mapped = ucp_rkey_ptr(rkey, a.region_base, &mapped) == UCS_OK;
  switch (options_.write_mode) {
    case WriteMode::kPut:
      conn->use_put = true;
      break;
    case WriteMode::kAm:
      conn->use_put = false;
      break;
    case WriteMode::kAuto:
    case WriteMode::kMemcpy:
      if (is_mapped) {
        // The peer's region is mapped here (UCX-allocated shm): copy straight into it with
        // streaming stores instead of a UCX lane (cma: process_vm_writev), 1.3-1.8x faster here
        // (transfer/README.md).
        conn->use_put = true;
        conn->mapped_base = static_cast<uint8_t*>(mapped);
      } else {
        conn->use_put = has_rma_lane;
      }
      break;
  }
  conn->meta->lane = conn->mapped_base != nullptr ? "memcpy" : (conn->use_put ? "put" : "am");
  // Can this side stop the peer's writes into our region (Fence)? Only if all of them come as
  // our "am" data messages, which our handler can drop: the peer does not force puts (UCX
  // applies puts itself, even emulated ones), and no lane between us could map our region
  // (posix, sysv), write it directly (cma, knem, xpmem) or put into it (an rma_bw lane).
  const absl::StatusOr<WriteMode> peer_mode = ParseWriteMode(a.write_mode);
  conn->meta->revocable = !(peer_mode.ok() && *peer_mode == WriteMode::kPut) && !has_rma_lane;
  for (const char* tl : {"posix/", "sysv/", "cma/", "knem/", "xpmem/", "self/"}) {
    if (absl::StrContains(ep_info, tl)) conn->meta->revocable = false;
  }
  DUET_LOG(DEBUG) << "ucx '" << options_.name << "' -> '" << a.name << "': lane "
                  << conn->meta->lane << (is_mapped ? " (remote region mapped)" : "")
                  << (conn->peer_err_mode ? ", err mode peer" : ", err mode none + watchdog")
                  << "\n"
                  << ep_info;
  {
    absl::MutexLock lock(&peers_mu_);
    peers_[id] = conn->meta;
    peer_by_instance_[a.instance] = id;
  }
  conns_[id] = std::move(conn);
  return absl::OkStatus();
}

absl::StatusOr<PeerInfo> UcxTransport::GetPeerInfo(PeerId peer) {
  absl::MutexLock lock(&peers_mu_);
  auto it = peers_.find(peer);
  if (it == peers_.end()) {
    return absl::NotFoundError(absl::StrCat("ucx transport '", options_.name, "': no peer ", peer));
  }
  const PeerMeta& m = *it->second;
  return PeerInfo{m.address.name, m.address.instance, m.address.layout, m.address.region_bytes,
                  m.lane};
}

absl::Status UcxTransport::PeerStatus(PeerId peer) {
  absl::MutexLock lock(&peers_mu_);
  auto it = peers_.find(peer);
  if (it == peers_.end()) {
    return absl::NotFoundError(absl::StrCat("ucx transport '", options_.name, "': no peer ", peer));
  }
  if (it->second->closed) {
    return absl::FailedPreconditionError(
        absl::StrCat("peer '", it->second->address.name, "' was disconnected"));
  }
  return it->second->status;
}

absl::Status UcxTransport::Disconnect(PeerId peer, absl::Time deadline) {
  // Refuse new writes, wait for the peer's transfers to end, then close the endpoint. The
  // worker calls get a grace beyond `deadline` (a busy progress thread is not a reason to
  // leave the endpoint open); transfers still running at `deadline` are cut by a forced close.
  const absl::Time grace = deadline + absl::Seconds(3);
  auto busy = std::make_shared<std::atomic<bool>>(true);
  DUET_RETURN_IF_ERROR(RunOnWorker(
      [this, peer] {
        auto it = conns_.find(peer);
        if (it == conns_.end()) return absl::NotFoundError(absl::StrCat("no peer ", peer));
        it->second->closing = true;
        return absl::OkStatus();
      },
      grace));
  while (absl::Now() < deadline) {
    absl::Status s = RunOnWorker(
        [this, peer, busy] {
          bool any = false;
          for (const auto& t : active_)
            any |= (t->peer != nullptr && t->peer->id == peer && !t->completed);
          busy->store(any);
          return absl::OkStatus();
        },
        deadline);
    if (!s.ok() || !busy->load()) break;
    absl::SleepFor(absl::Microseconds(200));
  }
  const bool force = busy->load();
  absl::Status s = RunOnWorker(
      [this, peer, force] {
        auto it = conns_.find(peer);
        if (it == conns_.end()) return absl::OkStatus();
        PeerConn& c = *it->second;
        for (auto& t : active_) {
          if (t->peer == &c) {
            if (!t->completed) {
              t->rec->Complete(absl::AbortedError("endpoint closed by Disconnect"));
              t->completed = true;
            }
            t->peer = nullptr;
          }
        }
        c.rkey.reset();
        if (c.ep != nullptr) {
          c.ep.get_deleter().force = force || c.failed;
          c.ep.reset();
        }
        conns_.erase(it);
        return absl::OkStatus();
      },
      grace);
  absl::MutexLock lock(&peers_mu_);
  auto it = peers_.find(peer);
  if (it != peers_.end()) it->second->closed = true;
  return s;
}

absl::StatusOr<FenceResult> UcxTransport::Fence(PeerId peer, absl::Time deadline) {
  std::string name;
  uint64_t instance;
  bool revocable;
  {
    absl::MutexLock lock(&peers_mu_);
    auto it = peers_.find(peer);
    if (it == peers_.end()) {
      return absl::NotFoundError(
          absl::StrCat("ucx transport '", options_.name, "': no peer ", peer));
    }
    PeerMeta& m = *it->second;
    name = m.address.name;
    instance = m.address.instance;
    revocable = m.revocable;
    m.fenced = true;
  }
  if (!revocable) {
    // It may map our region or write it with puts UCX applies itself: nothing here can stop
    // that. Keep the endpoint, so that its notices and its process's exit are still seen.
    DUET_LOG(WARNING) << "ucx '" << options_.name << "': fenced peer '" << name
                      << "'; its writes cannot be revoked (shared memory or one-sided lane)";
    return FenceResult{false, absl::StrCat("peer '", name,
                                           "' writes over shared memory or a "
                                           "one-sided lane: not revocable")};
  }
  // From now on the worker drops its data messages and its data-bearing notices; then close
  // the endpoint, and wait until no receive of its data that was already posted can land.
  DUET_RETURN_IF_ERROR(RunOnWorker(
      [this, peer, instance] {
        dropped_senders_.insert(instance);
        for (auto it = arrivals_.begin(); it != arrivals_.end();) {
          it = it->first.first == instance ? arrivals_.erase(it) : std::next(it);
        }
        stats_.SetPendingArrivals(static_cast<int64_t>(arrivals_.size()));
        auto it = conns_.find(peer);
        if (it != conns_.end()) {
          PeerConn& c = *it->second;
          for (auto& t : active_) {
            if (t->peer == &c) {
              if (!t->completed) {
                t->rec->Complete(absl::UnavailableError("endpoint closed: peer fenced"));
                t->completed = true;
              }
              t->peer = nullptr;
            }
          }
          c.rkey.reset();
          if (c.ep != nullptr) {
            c.ep.get_deleter().force = true;  // a silent peer would stall a graceful close
            c.ep.reset();
          }
          conns_.erase(it);
        }
        return absl::OkStatus();
      },
      deadline));
  auto inflight = std::make_shared<std::atomic<int>>(0);
  while (true) {
    DUET_RETURN_IF_ERROR(RunOnWorker(
        [this, instance, inflight] {
          auto it = rndv_inflight_.find(instance);
          inflight->store(it == rndv_inflight_.end() ? 0 : it->second);
          return absl::OkStatus();
        },
        deadline));
    if (inflight->load() == 0) break;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("ucx transport '", options_.name,
                                                      "': fencing '", name, "': ", inflight->load(),
                                                      " receives of its data still in flight"));
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  {
    // Only now: PeerStatus reporting it closed lets the tracker release its blocks.
    absl::MutexLock lock(&peers_mu_);
    auto it = peers_.find(peer);
    if (it != peers_.end()) {
      it->second->closed = true;
      it->second->status = absl::UnavailableError(
          absl::StrCat("peer '", name, "' fenced: it did not confirm a transfer quiet in time"));
    }
  }
  DUET_LOG(WARNING) << "ucx '" << options_.name << "': fenced peer '" << name
                    << "': its data is dropped and its endpoint closed";
  return FenceResult{true, absl::StrCat("peer '", name,
                                        "' writes through our data messages "
                                        "(am lane): dropped from now on, endpoint closed")};
}

absl::StatusOr<PeerId> UcxTransport::Redial(PeerId peer, absl::Time deadline) {
  std::string blob;
  {
    absl::MutexLock lock(&peers_mu_);
    auto it = peers_.find(peer);
    if (it == peers_.end()) {
      return absl::NotFoundError(
          absl::StrCat("ucx transport '", options_.name, "': no peer ", peer));
    }
    blob = EncodePeerAddress(it->second->address);
  }
  return Connect(blob, deadline);
}

absl::Status UcxTransport::Unfence(PeerId peer) {
  uint64_t instance;
  {
    absl::MutexLock lock(&peers_mu_);
    auto it = peers_.find(peer);
    if (it == peers_.end()) {
      return absl::NotFoundError(
          absl::StrCat("ucx transport '", options_.name, "': no peer ", peer));
    }
    it->second->fenced = false;
    instance = it->second->address.instance;
  }
  return RunOnWorker(
      [this, instance] {
        dropped_senders_.erase(instance);
        return absl::OkStatus();
      },
      absl::Now() + absl::Seconds(3));
}

// ---------------------------------------------------------------------------------------------
// Writes and notices (caller side).

absl::StatusOr<TransferHandle> UcxTransport::PostWrite(PeerId peer, std::vector<WriteOp> ops,
                                                       std::optional<std::string> notice) {
  uint64_t remote_bytes, remote_base;
  std::string peer_name;
  {
    absl::MutexLock lock(&peers_mu_);
    auto it = peers_.find(peer);
    if (it == peers_.end() || it->second->closed) {
      return absl::NotFoundError(
          absl::StrCat("ucx transport '", options_.name, "': no peer ", peer));
    }
    DUET_RETURN_IF_ERROR(it->second->status);
    remote_bytes = it->second->address.region_bytes;
    remote_base = it->second->address.region_base;
    peer_name = it->second->address.name;
  }
  uint8_t* local_base;
  uint64_t local_bytes;
  {
    absl::MutexLock lock(&slot_->mu);
    local_base = slot_->base;
    local_bytes = slot_->bytes;
  }
  if (local_base == nullptr) return absl::FailedPreconditionError("ucx: no registered region");
  DUET_RETURN_IF_ERROR(ValidateOps(ops, local_bytes, remote_bytes));
  for (const WriteOp& op : ops) stats_.Posted(op.length);

  auto t = std::make_unique<ActiveTransfer>();
  t->ops = std::move(ops);
  t->rec = std::make_shared<internal::TransferRecord>();
  std::weak_ptr<Waker> waker = waker_;
  t->rec->set_on_cancel([waker] {
    if (auto w = waker.lock()) w->Signal();
  });
  t->notice = std::move(notice);
  t->local_base = local_base;
  t->remote_base = remote_base;
  TransferHandle handle(t->rec);
  ActiveTransfer* raw = t.release();
  Enqueue([this, raw, peer, peer_name] {
    std::unique_ptr<ActiveTransfer> t(raw);
    auto it = conns_.find(peer);
    if (it == conns_.end() || it->second->failed || it->second->closing) {
      t->rec->Complete(
          absl::UnavailableError(absl::StrCat("peer '", peer_name, "' is closed or lost")));
      stats_.Ended(TransferState::kFailed);
      return;
    }
    t->peer = it->second.get();
    t->notice_header = NoticeHeader{instance_, next_xfer_++, 0, 0};
    // Chunk per lane: ~1 MiB puts are the sweet spot over shm; rendezvous messages over tcp
    // amortise their handshake better with larger chunks.
    // On the "am" lane a chunk that goes eager (<= am_eager_max_bytes) is sent as messages of
    // at most kAmEagerMessageBytes, each one UCX fragment: the receiver copies it from UCX's
    // receive buffer straight into place. A multi-fragment eager message is first reassembled
    // by UCX into a buffer of its own (one more copy of every byte on the receiver): with
    // 4 MiB eager chunks over tcp that held the lane at 2.5-2.9 GB/s, 48 KiB ones reach
    // 4.3-5.1 GB/s (transfer/README.md).
    const uint64_t chunk = t->peer->use_put ? options_.chunk_bytes : options_.am_chunk_bytes;
    for (const WriteOp& op : t->ops) {
      for (uint64_t done = 0; done < op.length; done += chunk) {
        const uint64_t len = std::min(chunk, op.length - done);
        const uint64_t piece = !t->peer->use_put && len <= options_.am_eager_max_bytes
                                   ? std::min(len, kAmEagerMessageBytes)
                                   : len;
        for (uint64_t p = 0; p < len; p += piece) {
          t->chunks.push_back(WriteOp{op.local_offset + done + p, op.remote_offset + done + p,
                                      std::min(piece, len - p)});
        }
      }
    }
    t->ops.clear();
    if (t->peer->use_put) {
      t->steps = {Step::kData,     Step::kWaitIdle, Step::kFlush,
                  Step::kWaitIdle, Step::kNotice,   Step::kWaitIdle};
    } else {
      for (const WriteOp& c : t->chunks) {
        t->headers.push_back(DataHeader{instance_, t->notice_header.xfer, c.remote_offset,
                                        t->notice.has_value() ? 1u : 0u});
        t->notice_header.data_bytes += c.length;
      }
      t->steps = {Step::kData, Step::kNotice, Step::kWaitIdle, Step::kFlush, Step::kWaitIdle};
    }
    active_.push_back(std::move(t));
  });
  return handle;
}

std::vector<Notice> UcxTransport::DrainNotices() {
  absl::MutexLock lock(&notice_mu_);
  std::vector<Notice> out(std::make_move_iterator(notices_.begin()),
                          std::make_move_iterator(notices_.end()));
  notices_.clear();
  stats_.NoticesReceived(out.size());
  return out;
}

bool UcxTransport::WaitForNotices(absl::Time deadline) {
  absl::MutexLock lock(&notice_mu_);
  auto has = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(notice_mu_) { return !notices_.empty(); };
  return notice_mu_.AwaitWithDeadline(absl::Condition(&has), deadline);
}

}  // namespace duet::transfer::ucx_internal

namespace duet::transfer {

absl::StatusOr<std::unique_ptr<Transport>> CreateUcxTransport(const TransportOptions& options) {
  return ucx_internal::UcxTransport::Create(options);
}

constexpr EnumNameEntry<UcxProfileKind> kUcxProfileKindNames[] = {
    {UcxProfileKind::kShm, "shm"},
    {UcxProfileKind::kTcp, "tcp"},
    {UcxProfileKind::kShmMm, "shm-mm"}};

absl::StatusOr<UcxProfileKind> ParseUcxProfileKind(absl::string_view name) {
  return ParseEnum(kUcxProfileKindNames, name, "ucx profile");
}

const char* UcxProfileKindName(UcxProfileKind kind) { return EnumName(kUcxProfileKindNames, kind); }

UcxProfile UcxProfileOf(UcxProfileKind kind) {
  switch (kind) {
    case UcxProfileKind::kShm:
      // One mm transport: sysv, whose allocator UCX tries first for the exported pool (so the
      // peer maps it), plus cma for memory it did not allocate. posix is the same transport
      // over /dev/shm; listing it too only adds a second set of receive rings (2 MB per
      // process).
      return UcxProfile{"sysv,cma,self", ""};
    case UcxProfileKind::kTcp:
      return UcxProfile{"tcp,self", "lo"};
    case UcxProfileKind::kShmMm:
      // Shared memory without cma: puts into a UCX-allocated (mapped) region are plain memcpy.
      return UcxProfile{"sysv,self", ""};
  }
  return UcxProfile{};
}

absl::StatusOr<UcxProfile> UcxProfileByName(absl::string_view name) {
  absl::StatusOr<UcxProfileKind> kind = ParseUcxProfileKind(name);
  if (!kind.ok()) return kind.status();
  return UcxProfileOf(*kind);
}

}  // namespace duet::transfer
