#include "transfer/inproc/inproc_transport.h"

#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "transfer/peer_address.h"

namespace duet::transfer {
namespace {

// The part of a transport that peers touch: its region and its notice queue.
struct Endpoint {
  absl::Mutex mu;
  bool alive ABSL_GUARDED_BY(mu) = true;
  uint8_t* base ABSL_GUARDED_BY(mu) = nullptr;
  uint64_t bytes ABSL_GUARDED_BY(mu) = 0;
  std::deque<Notice> notices ABSL_GUARDED_BY(mu);
  std::map<uint64_t, PeerId> peer_by_instance ABSL_GUARDED_BY(mu);
  // Writers whose writes are refused from now on (Fence on a revocable transport).
  std::set<uint64_t> fenced_writers ABSL_GUARDED_BY(mu);
};

absl::Mutex fabric_mu(absl::kConstInit);
std::map<uint64_t, std::shared_ptr<Endpoint>>& Fabric() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fabric_mu) {
  static auto* fabric = new std::map<uint64_t, std::shared_ptr<Endpoint>>();
  return *fabric;
}

class InprocRegion : public MemoryRegion {
 public:
  InprocRegion(std::shared_ptr<Endpoint> ep, void* base, size_t bytes, bool owned)
      : ep_(std::move(ep)), base_(base), bytes_(bytes), owned_(owned) {}
  ~InprocRegion() override {
    {
      absl::MutexLock lock(&ep_->mu);
      ep_->base = nullptr;
      ep_->bytes = 0;
    }
    if (owned_) std::free(base_);
  }
  void* base() const override { return base_; }
  size_t bytes() const override { return bytes_; }

 private:
  std::shared_ptr<Endpoint> ep_;
  void* base_;
  size_t bytes_;
  bool owned_;
};

struct Peer {
  PeerAddress address;
  std::shared_ptr<Endpoint> ep;
  bool closed = false;
  // Writes posted into a black hole (TransportOptions::inproc_black_hole): pending until
  // Disconnect.
  std::vector<std::shared_ptr<internal::TransferRecord>> held;
};

class InprocTransport : public Transport {
 public:
  explicit InprocTransport(const TransportOptions& options)
      : options_(options), instance_(NewInstanceId()), self_(std::make_shared<Endpoint>()) {
    absl::MutexLock lock(&fabric_mu);
    Fabric()[instance_] = self_;
  }
  ~InprocTransport() override {
    {
      absl::MutexLock lock(&fabric_mu);
      Fabric().erase(instance_);
    }
    absl::MutexLock lock(&self_->mu);
    self_->alive = false;
  }

  std::string backend() const override { return "inproc"; }
  uint32_t capabilities() const override {
    return kCapOneSidedWrite | kCapNotices | kCapPeerFailureDetection | kCapAllocateRegion |
           kCapCancel;
  }
  const TransportOptions& options() const override { return options_; }

  absl::StatusOr<std::unique_ptr<MemoryRegion>> Register(void* base, size_t bytes) override {
    return Export(base, bytes, false);
  }
  absl::StatusOr<std::unique_ptr<MemoryRegion>> AllocateRegion(size_t bytes) override {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (p == nullptr)
      return absl::ResourceExhaustedError(absl::StrCat("inproc: ", bytes, " bytes"));
    std::memset(p, 0, bytes);
    return Export(p, bytes, true);
  }

  absl::StatusOr<std::string> LocalAddress() override {
    absl::MutexLock lock(&self_->mu);
    if (self_->base == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("transport '", options_.name, "': register a region before LocalAddress"));
    }
    PeerAddress a{.backend = "inproc",
                  .name = options_.name,
                  .instance = instance_,
                  .layout = options_.layout,
                  .region_base = reinterpret_cast<uint64_t>(self_->base),
                  .region_bytes = self_->bytes};
    return EncodePeerAddress(a);
  }

  absl::StatusOr<PeerId> Connect(const std::string& blob, absl::Time deadline) override {
    DUET_ASSIGN_OR_RETURN(PeerAddress a, DecodePeerAddress(blob));
    if (a.backend != "inproc") {
      return absl::InvalidArgumentError(absl::StrCat("transport '", options_.name,
                                                     "' (inproc) cannot connect to '", a.name,
                                                     "' (", a.backend, ")"));
    }
    DUET_RETURN_IF_ERROR(kv::CheckLayoutsMatch(options_.layout, a.layout, options_.name, a.name));
    std::shared_ptr<Endpoint> ep;
    {
      absl::MutexLock lock(&fabric_mu);
      auto it = Fabric().find(a.instance);
      if (it == Fabric().end()) {
        return absl::UnavailableError(absl::StrCat("inproc peer '", a.name, "' is gone"));
      }
      ep = it->second;
    }
    absl::MutexLock lock(&mu_);
    for (auto& [id, p] : peers_) {
      if (p.address.instance == a.instance && !p.closed) return id;
    }
    const PeerId id = next_peer_++;
    peers_[id] = Peer{a, ep};
    absl::MutexLock self_lock(&self_->mu);
    self_->peer_by_instance[a.instance] = id;
    return id;
  }

  absl::StatusOr<PeerId> Redial(PeerId peer, absl::Time deadline) override {
    std::string blob;
    {
      absl::MutexLock lock(&mu_);
      auto it = peers_.find(peer);
      if (it == peers_.end()) {
        return absl::NotFoundError(absl::StrCat("transport '", options_.name, "': no peer ", peer));
      }
      blob = EncodePeerAddress(it->second.address);
    }
    return Connect(blob, deadline);
  }

  absl::StatusOr<PeerInfo> GetPeerInfo(PeerId peer) override {
    absl::MutexLock lock(&mu_);
    DUET_ASSIGN_OR_RETURN(Peer * p, FindPeer(peer));
    return PeerInfo{p->address.name, p->address.instance, p->address.layout,
                    p->address.region_bytes, "memcpy"};
  }

  absl::Status PeerStatus(PeerId peer) override {
    absl::MutexLock lock(&mu_);
    if (auto it = peers_.find(peer); it != peers_.end() && it->second.closed) {
      return absl::FailedPreconditionError(
          absl::StrCat("peer '", it->second.address.name, "' was disconnected"));
    }
    DUET_ASSIGN_OR_RETURN(Peer * p, FindPeer(peer));
    absl::MutexLock peer_lock(&p->ep->mu);
    if (!p->ep->alive) {
      return absl::UnavailableError(absl::StrCat("peer '", p->address.name, "' is gone"));
    }
    return absl::OkStatus();
  }

  absl::Status Disconnect(PeerId peer, absl::Time deadline) override {
    absl::MutexLock lock(&mu_);
    DUET_ASSIGN_OR_RETURN(Peer * p, FindPeer(peer));
    p->closed = true;
    for (auto& rec : p->held) {
      rec->Complete(absl::AbortedError("endpoint closed by Disconnect"));
      stats_.Ended(TransferState::kFailed);
    }
    p->held.clear();
    return absl::OkStatus();
  }

  absl::StatusOr<FenceResult> Fence(PeerId peer, absl::Time deadline) override {
    absl::MutexLock lock(&mu_);
    auto it = peers_.find(peer);
    if (it == peers_.end()) {
      return absl::NotFoundError(absl::StrCat("transport '", options_.name, "': no peer ", peer));
    }
    Peer& p = it->second;
    if (!options_.inproc_revocable) {
      // Models a peer that maps our region: nothing stops its writes; the endpoint stays so its
      // notices and its end are still seen.
      return FenceResult{false,
                         "inproc (modelled shared memory): the peer's writes cannot be "
                         "revoked"};
    }
    {
      // Its writes copy under our endpoint's lock: once this returns, none is half done and
      // every later one is refused.
      absl::MutexLock self_lock(&self_->mu);
      self_->fenced_writers.insert(p.address.instance);
    }
    p.closed = true;
    return FenceResult{true, "inproc: the peer's writes are refused and its endpoint closed"};
  }

  absl::Status Unfence(PeerId peer) override {
    absl::MutexLock lock(&mu_);
    auto it = peers_.find(peer);
    if (it == peers_.end()) {
      return absl::NotFoundError(absl::StrCat("transport '", options_.name, "': no peer ", peer));
    }
    absl::MutexLock self_lock(&self_->mu);
    self_->fenced_writers.erase(it->second.address.instance);
    return absl::OkStatus();
  }

  absl::StatusOr<TransferHandle> PostWrite(PeerId peer, std::vector<WriteOp> ops,
                                           std::optional<std::string> notice) override {
    std::shared_ptr<Endpoint> ep;
    std::string peer_name;
    {
      absl::MutexLock lock(&mu_);
      DUET_ASSIGN_OR_RETURN(Peer * p, FindPeer(peer));
      if (options_.inproc_black_hole != nullptr && options_.inproc_black_hole->load()) {
        for (const WriteOp& op : ops) stats_.Posted(op.length);
        p->held.push_back(std::make_shared<internal::TransferRecord>());
        return TransferHandle(p->held.back());
      }
      ep = p->ep;
      peer_name = p->address.name;
    }
    uint8_t* local;
    uint64_t local_bytes;
    {
      absl::MutexLock lock(&self_->mu);
      local = self_->base;
      local_bytes = self_->bytes;
    }
    auto rec = std::make_shared<internal::TransferRecord>();
    absl::MutexLock lock(&ep->mu);
    if (!ep->alive || ep->base == nullptr) {
      return absl::UnavailableError(absl::StrCat("peer '", peer_name, "' is gone"));
    }
    // A fenced writer's data is refused; a notice alone (it confirms it is quiet) still lands.
    if (!ops.empty() && ep->fenced_writers.count(instance_)) {
      stats_.Ended(TransferState::kFailed);
      return absl::UnavailableError(
          absl::StrCat("peer '", peer_name, "' fenced '", options_.name, "': write refused"));
    }
    DUET_RETURN_IF_ERROR(ValidateOps(ops, local_bytes, ep->bytes));
    for (const WriteOp& op : ops) {
      std::memmove(ep->base + op.remote_offset, local + op.local_offset, op.length);
      stats_.Posted(op.length);
    }
    if (notice.has_value()) {
      auto it = ep->peer_by_instance.find(instance_);
      ep->notices.push_back(
          Notice{it == ep->peer_by_instance.end() ? 0 : it->second, instance_, std::move(*notice)});
    }
    rec->Complete(absl::OkStatus());
    stats_.Ended(TransferState::kDone);
    return TransferHandle(rec);
  }

  std::vector<Notice> DrainNotices() override {
    absl::MutexLock lock(&self_->mu);
    std::vector<Notice> out(std::make_move_iterator(self_->notices.begin()),
                            std::make_move_iterator(self_->notices.end()));
    self_->notices.clear();
    stats_.NoticesReceived(out.size());
    return out;
  }

  TransportStats Stats() const override { return stats_.Snapshot(); }

  bool WaitForNotices(absl::Time deadline) override {
    absl::MutexLock lock(&self_->mu);
    auto has = [this]()
                   ABSL_EXCLUSIVE_LOCKS_REQUIRED(self_->mu) { return !self_->notices.empty(); };
    return self_->mu.AwaitWithDeadline(absl::Condition(&has), deadline);
  }

 private:
  absl::StatusOr<std::unique_ptr<MemoryRegion>> Export(void* base, size_t bytes, bool owned) {
    if (base == nullptr || bytes == 0) return absl::InvalidArgumentError("inproc: empty region");
    absl::MutexLock lock(&self_->mu);
    if (self_->base != nullptr) {
      if (owned) std::free(base);
      return absl::AlreadyExistsError(
          absl::StrCat("transport '", options_.name, "' already exports a region"));
    }
    self_->base = static_cast<uint8_t*>(base);
    self_->bytes = bytes;
    return std::unique_ptr<MemoryRegion>(new InprocRegion(self_, base, bytes, owned));
  }

  absl::StatusOr<Peer*> FindPeer(PeerId peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = peers_.find(peer);
    if (it == peers_.end() || it->second.closed) {
      return absl::NotFoundError(absl::StrCat("transport '", options_.name, "': no peer ", peer));
    }
    return &it->second;
  }

  const TransportOptions options_;
  const uint64_t instance_;
  const std::shared_ptr<Endpoint> self_;
  absl::Mutex mu_;
  std::map<PeerId, Peer> peers_ ABSL_GUARDED_BY(mu_);
  PeerId next_peer_ ABSL_GUARDED_BY(mu_) = 1;
  internal::StatsCounters stats_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> CreateInprocTransport(const TransportOptions& options) {
  return std::unique_ptr<Transport>(new InprocTransport(options));
}

}  // namespace duet::transfer
