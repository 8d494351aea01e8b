#include "common/kv/disk_tier.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "common/kv/block_pool.h"
#include "xxhash.h"

namespace duet::kv {
namespace {

constexpr uint64_t kMagic = 0x31304b5654455544ull;  // "DUETKV01"
constexpr uint32_t kVersion = 1;
constexpr int64_t kAlign = 4096;

// The fixed part of a slot's header; the block's token ids follow it.
struct SlotHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t block_size;
  uint64_t layout_fingerprint;
  uint64_t seed_low, seed_high;
  uint64_t hash_low, hash_high;
  uint64_t payload_bytes;
  uint64_t payload_xxh3;
  uint64_t seq;          // write order: the LRU order a reopened tier restores
  uint64_t header_xxh3;  // of this struct (this field 0) and the token ids
};

int64_t RoundUp(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

int64_t HeaderBytes(const KvLayout& layout) {
  return RoundUp(static_cast<int64_t>(sizeof(SlotHeader)) +
                 static_cast<int64_t>(sizeof(int32_t)) * layout.block_size);
}

int64_t PayloadBytes(const KvLayout& layout) {
  return static_cast<int64_t>(layout.num_layers) * static_cast<int64_t>(layout.BlockBytes());
}

uint64_t HeaderChecksum(SlotHeader h, const uint8_t* tokens, size_t token_bytes) {
  h.header_xxh3 = 0;
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, &h, sizeof(h));
  XXH3_64bits_update(st, tokens, token_bytes);
  const uint64_t sum = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return sum;
}

absl::Status ErrnoError(const std::string& what, int err) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(err), " (errno ", err, ")"));
}

// Reads up to n bytes at `offset`; the count read (short at the file's end), or the error.
absl::StatusOr<int64_t> ReadAt(int fd, uint8_t* buf, int64_t n, int64_t offset,
                               const std::string& path) {
  int64_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, buf + got, static_cast<size_t>(n - got), offset + got);
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(absl::StrCat("kv disk tier ", path, ": read at ", offset + got), errno);
    }
    if (r == 0) break;
    got += r;
  }
  return got;
}

}  // namespace

absl::StatusOr<BlockHash> DiskTierIdentity(const BlockHash& seed, const std::string& model_path) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  std::error_code ec;
  if (fs::is_directory(model_path, ec)) {
    for (const fs::directory_entry& e : fs::directory_iterator(model_path, ec)) {
      const std::string ext = e.path().extension().string();
      if (e.is_regular_file() && (ext == ".safetensors" || ext == ".gguf" || ext == ".bin")) {
        files.push_back(e.path());
      }
    }
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(model_path);
  }
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  std::vector<uint8_t> buf(1 << 20);
  absl::Status failed;
  for (const fs::path& f : files) {
    ScopedFd fd(::open(f.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) {
      failed =
          ErrnoError(absl::StrCat("kv disk tier: reading ", f.string(), " for its digest"), errno);
      break;
    }
    const std::string name = f.filename().string();
    XXH3_64bits_update(st, name.data(), name.size());
    for (int64_t off = 0;;) {
      absl::StatusOr<int64_t> got =
          ReadAt(fd.get(), buf.data(), static_cast<int64_t>(buf.size()), off, f.string());
      if (!got.ok()) {
        failed = got.status();
        break;
      }
      XXH3_64bits_update(st, buf.data(), static_cast<size_t>(*got));
      off += *got;
      if (*got < static_cast<int64_t>(buf.size())) break;
    }
    if (!failed.ok()) break;
  }
  const uint64_t digest = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  if (!failed.ok()) return failed;
  return SeedFromText(absl::StrCat(seed.ToHex(), "|weights xxh3-64 ", absl::Hex(digest)));
}

int64_t DiskTier::SlotBytes(const KvLayout& layout) {
  return HeaderBytes(layout) + RoundUp(PayloadBytes(layout));
}

absl::StatusOr<std::unique_ptr<DiskTier>> DiskTier::Open(const DiskTierOptions& options,
                                                         const KvLayout& layout,
                                                         const BlockHash& seed) {
  if (options.path.empty()) {
    return absl::InvalidArgumentError("kv disk tier: --kv_disk_path is empty");
  }
  const int64_t slot = SlotBytes(layout);
  const int64_t slots = options.bytes / slot;
  if (slots < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv disk tier: --kv_disk_bytes ", options.bytes, " holds no block: one block of ",
        layout.Describe(), " takes ", slot, " bytes on disk"));
  }
  if (options.admit_after_hits < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv disk tier: --kv_disk_admit_hits must be >= 0, not ", options.admit_after_hits));
  }
  ScopedFd fd(::open(options.path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (fd.get() < 0) {
    return ErrnoError(absl::StrCat("kv disk tier: cannot open ", options.path), errno);
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) {
    return ErrnoError(absl::StrCat("kv disk tier: ", options.path), errno);
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv disk tier: ", options.path, " is not a regular file"));
  }
  // One process per file: a second would overwrite the first one's slots under it.
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrCat("kv disk tier: ", options.path,
                       " is in use by another process (a node with the same id?)"));
    }
    return ErrnoError(absl::StrCat("kv disk tier: cannot lock ", options.path), err);
  }
  auto tier = std::unique_ptr<DiskTier>(new DiskTier(options, layout, seed, std::move(fd), slots));
  DUET_RETURN_IF_ERROR(tier->Restore());
  // Preallocated, so that a full disk fails here and not in the middle of serving.
  const int64_t need = slots * slot;
  if (st.st_size < need) {
    const int err = ::posix_fallocate(tier->fd_.get(), 0, need);
    if (err != 0) {
      return ErrnoError(
          absl::StrCat("kv disk tier: cannot preallocate ", need, " bytes in ", options.path), err);
    }
  }
  tier->writer_ = std::thread([t = tier.get()] { t->WriterLoop(); });
  return tier;
}

DiskTier::DiskTier(const DiskTierOptions& options, const KvLayout& layout, const BlockHash& seed,
                   ScopedFd fd, int64_t slots)
    : options_(options),
      layout_(layout),
      seed_(seed),
      fd_(std::move(fd)),
      num_slots_(slots),
      slot_bytes_(SlotBytes(layout)),
      payload_bytes_(PayloadBytes(layout)) {
  absl::MutexLock lock(&mu_);
  slots_.resize(static_cast<size_t>(slots));
  stats_.slots = slots;
}

DiskTier::~DiskTier() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (writer_.joinable()) writer_.join();
}

absl::Status DiskTier::Restore() {
  const int64_t hb = HeaderBytes(layout_);
  std::vector<uint8_t> buf(static_cast<size_t>(hb));
  std::vector<std::pair<uint64_t, int64_t>> found;  // seq, slot
  absl::flat_hash_map<BlockHash, std::pair<uint64_t, int64_t>> newest;
  for (int64_t i = 0; i < num_slots_; ++i) {
    DUET_ASSIGN_OR_RETURN(int64_t got,
                          ReadAt(fd_.get(), buf.data(), hb, i * slot_bytes_, options_.path));
    if (got < hb) break;  // past the file's end: nothing further was written
    SlotHeader h;
    std::memcpy(&h, buf.data(), sizeof(h));
    if (h.magic != kMagic || h.version != kVersion ||
        h.block_size != static_cast<uint32_t>(layout_.block_size) ||
        h.layout_fingerprint != layout_.Fingerprint() || h.seed_low != seed_.low ||
        h.seed_high != seed_.high || h.payload_bytes != static_cast<uint64_t>(payload_bytes_) ||
        h.header_xxh3 !=
            HeaderChecksum(h, buf.data() + sizeof(h), sizeof(int32_t) * layout_.block_size)) {
      continue;  // empty, torn, or another layout's: free
    }
    const BlockHash hash{h.hash_low, h.hash_high};
    auto [it, inserted] = newest.try_emplace(hash, h.seq, i);
    if (!inserted && it->second.first < h.seq) it->second = {h.seq, i};
  }
  for (const auto& [hash, at] : newest) found.push_back(at);
  std::sort(found.begin(), found.end());
  absl::MutexLock lock(&mu_);
  for (const auto& [hash, at] : newest) {
    Slot& s = slots_[static_cast<size_t>(at.second)];
    s.valid = true;
    s.hash = hash;
    index_[hash] = at.second;
    next_seq_ = std::max(next_seq_, at.first + 1);
  }
  // Least recently written first: the order they were last used in, near enough.
  for (const auto& [seq, i] : found) {
    slots_[static_cast<size_t>(i)].lru = lru_.insert(lru_.end(), i);
  }
  for (int64_t i = num_slots_ - 1; i >= 0; --i) {
    if (!slots_[static_cast<size_t>(i)].valid) free_.push_back(i);
  }
  stats_.restored = static_cast<int64_t>(found.size());
  return absl::OkStatus();
}

bool DiskTier::Offer(const BlockPool& pool, const EvictedBlock& block, absl::Time wait_until) {
  if (block.hits < options_.admit_after_hits) return false;
  {
    absl::MutexLock lock(&mu_);
    if (!enabled_ || stopping_ || index_.contains(block.hash) || queued_.contains(block.hash)) {
      return false;
    }
    auto room = [this] {
      mu_.AssertHeld();
      return !enabled_ || queue_.empty() ||
             staged_bytes_ + payload_bytes_ <= options_.staging_bytes;
    };
    if (!room()) {
      mu_.AwaitWithDeadline(absl::Condition(&room), wait_until);
      if (!room() || !enabled_) {
        ++stats_.dropped_staging;
        return false;
      }
    }
    queued_.insert(block.hash);
    staged_bytes_ += payload_bytes_;
  }
  // The copy, outside the lock: the block is the caller's until Offer returns.
  auto s = std::make_shared<Staged>(Staged{.hash = block.hash, .tokens = block.tokens});
  s->payload.resize(static_cast<size_t>(payload_bytes_));
  const size_t bb = layout_.BlockBytes();
  for (int l = 0; l < layout_.num_layers; ++l) {
    std::memcpy(s->payload.data() + static_cast<size_t>(l) * bb, pool.BlockAddress(l, block.id),
                bb);
  }
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(s));
  return true;
}

void DiskTier::WriterLoop() {
  while (WriteNext()) NotifyDropped();
  NotifyDropped();
}

bool DiskTier::WriteNext() {
  {
    std::shared_ptr<const Staged> staged;
    int64_t slot = -1;
    uint64_t seq = 0;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](DiskTier* t)
               ABSL_NO_THREAD_SAFETY_ANALYSIS { return t->stopping_ || !t->queue_.empty(); },
          this));
      if (queue_.empty()) return false;  // stopping, and everything queued is written
      staged = std::move(queue_.front());
      queue_.pop_front();
      staged_bytes_ -= payload_bytes_;
      if (enabled_) slot = TakeSlot();
      if (slot < 0) {
        queued_.erase(staged->hash);
        dropped_.push_back(staged->hash);
        if (enabled_) ++stats_.dropped_staging;  // every slot is being read
        return true;
      }
      seq = next_seq_++;
      writing_ = staged;  // a Load meanwhile copies it from memory
    }
    const Staged& s = *staged;
    const absl::Status w = Write(slot, s, seq);
    absl::MutexLock lock(&mu_);
    writing_.reset();
    queued_.erase(s.hash);
    if (!w.ok()) {
      free_.push_back(slot);
      ++stats_.io_errors;
      dropped_.push_back(s.hash);
      TurnOff(w);
      return true;
    }
    if (!enabled_) {  // turned off while this one was written: not kept
      free_.push_back(slot);
      dropped_.push_back(s.hash);
      return true;
    }
    Slot& sl = slots_[static_cast<size_t>(slot)];
    sl.valid = true;
    sl.hash = s.hash;
    sl.lru = lru_.insert(lru_.end(), slot);
    index_[s.hash] = slot;
    ++stats_.written;
    stats_.written_bytes += slot_bytes_;
  }
  return true;
}

void DiskTier::NotifyDropped() {
  std::vector<BlockHash> dropped;
  {
    absl::MutexLock lock(&mu_);
    if (dropped_.empty()) return;
    dropped.swap(dropped_);
    ++notifying_;
  }
  if (drop_listener_) {
    for (const BlockHash& h : dropped) drop_listener_(h);
  }
  absl::MutexLock lock(&mu_);
  --notifying_;
}

bool DiskTier::HoldsOrQueued(const BlockHash& hash) const {
  absl::MutexLock lock(&mu_);
  return enabled_ && (index_.contains(hash) || queued_.contains(hash));
}

std::vector<BlockHash> DiskTier::HeldHashes() const {
  absl::MutexLock lock(&mu_);
  std::vector<BlockHash> out;
  if (!enabled_) return out;
  out.reserve(index_.size());
  for (const auto& [hash, slot] : index_) out.push_back(hash);
  return out;
}

void DiskTier::SetDropListener(std::function<void(const BlockHash&)> listener) {
  drop_listener_ = std::move(listener);
}

absl::Status DiskTier::Write(int64_t slot, const Staged& s, uint64_t seq) {
  const int64_t hb = HeaderBytes(layout_);
  std::vector<uint8_t> head(static_cast<size_t>(hb), 0);
  SlotHeader h{.magic = kMagic,
               .version = kVersion,
               .block_size = static_cast<uint32_t>(layout_.block_size),
               .layout_fingerprint = layout_.Fingerprint(),
               .seed_low = seed_.low,
               .seed_high = seed_.high,
               .hash_low = s.hash.low,
               .hash_high = s.hash.high,
               .payload_bytes = static_cast<uint64_t>(payload_bytes_),
               .payload_xxh3 = XXH3_64bits(s.payload.data(), s.payload.size()),
               .seq = seq,
               .header_xxh3 = 0};
  const size_t token_bytes = sizeof(int32_t) * s.tokens.size();
  std::memcpy(head.data() + sizeof(h), s.tokens.data(), token_bytes);
  h.header_xxh3 = HeaderChecksum(h, head.data() + sizeof(h), token_bytes);
  std::memcpy(head.data(), &h, sizeof(h));
  iovec iov[2] = {{head.data(), head.size()},
                  {const_cast<uint8_t*>(s.payload.data()), s.payload.size()}};
  const int64_t total = hb + payload_bytes_;
  int64_t done = 0;
  const int64_t offset = slot * slot_bytes_;
  while (done < total) {
    ssize_t w;
    if (done == 0) {
      w = ::pwritev(fd_.get(), iov, 2, offset);
    } else if (done < hb) {
      iovec rest[2] = {{head.data() + done, static_cast<size_t>(hb - done)}, iov[1]};
      w = ::pwritev(fd_.get(), rest, 2, offset + done);
    } else {
      w = ::pwrite(fd_.get(), s.payload.data() + (done - hb), static_cast<size_t>(total - done),
                   offset + done);
    }
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(absl::StrCat("kv disk tier ", options_.path, ": write at ", offset + done),
                        errno);
    }
    if (w == 0) {
      return absl::InternalError(
          absl::StrCat("kv disk tier ", options_.path, ": write at ", offset + done, " wrote 0"));
    }
    done += w;
  }
  return absl::OkStatus();
}

int64_t DiskTier::Holds(absl::Span<const BlockHash> chain) const {
  absl::MutexLock lock(&mu_);
  if (!enabled_) return 0;
  int64_t n = 0;
  while (n < static_cast<int64_t>(chain.size()) &&
         (index_.contains(chain[n]) || queued_.contains(chain[n]))) {
    ++n;
  }
  return n;
}

absl::Status DiskTier::Load(const BlockHash& hash, absl::Span<const int32_t> tokens,
                            BlockPool& pool, BlockId id) {
  absl::Status s = LoadSlot(hash, tokens, pool, id);
  NotifyDropped();
  return s;
}

absl::Status DiskTier::LoadSlot(const BlockHash& hash, absl::Span<const int32_t> tokens,
                                BlockPool& pool, BlockId id) {
  int64_t slot;
  {
    absl::ReleasableMutexLock lock(&mu_);
    if (!enabled_) return absl::UnavailableError("kv disk tier: off after an I/O error");
    auto it = index_.find(hash);
    if (it == index_.end()) {
      // Offered and not written yet (often by the very allocation that asks for it back):
      // copied from the staged copy.
      std::shared_ptr<const Staged> staged;
      if (writing_ != nullptr && writing_->hash == hash) staged = writing_;
      for (const std::shared_ptr<const Staged>& q : queue_) {
        if (staged == nullptr && q->hash == hash) staged = q;
      }
      if (staged == nullptr) {
        return absl::NotFoundError(absl::StrCat("kv disk tier: block ", hash.ToHex(), " not held"));
      }
      lock.Release();
      if (!std::equal(tokens.begin(), tokens.end(), staged->tokens.begin(), staged->tokens.end())) {
        return absl::NotFoundError(
            absl::StrCat("kv disk tier: block ", hash.ToHex(), " holds other token ids"));
      }
      const size_t bb = layout_.BlockBytes();
      for (int l = 0; l < layout_.num_layers; ++l) {
        std::memcpy(pool.BlockAddress(l, id), staged->payload.data() + static_cast<size_t>(l) * bb,
                    bb);
      }
      absl::MutexLock again(&mu_);
      ++stats_.loaded;
      stats_.loaded_bytes += payload_bytes_;
      return absl::OkStatus();
    }
    slot = it->second;
    ++slots_[static_cast<size_t>(slot)].readers;
    Touch(slot);
  }
  const int64_t hb = HeaderBytes(layout_);
  std::vector<uint8_t> buf(static_cast<size_t>(hb + payload_bytes_));
  absl::StatusOr<int64_t> got = ReadAt(fd_.get(), buf.data(), static_cast<int64_t>(buf.size()),
                                       slot * slot_bytes_, options_.path);
  absl::Status bad;
  bool other_tokens = false;
  if (got.ok()) {
    SlotHeader h;
    std::memcpy(&h, buf.data(), sizeof(h));
    const uint8_t* stored_tokens = buf.data() + sizeof(h);
    const size_t token_bytes = sizeof(int32_t) * static_cast<size_t>(layout_.block_size);
    if (*got < static_cast<int64_t>(buf.size())) {
      bad = absl::DataLossError(absl::StrCat("truncated: ", *got, " of ", buf.size(), " bytes"));
    } else if (h.magic != kMagic || h.version != kVersion ||
               h.header_xxh3 != HeaderChecksum(h, stored_tokens, token_bytes)) {
      bad = absl::DataLossError("its header fails its checksum");
    } else if (h.hash_low != hash.low || h.hash_high != hash.high || h.seed_low != seed_.low ||
               h.seed_high != seed_.high || h.layout_fingerprint != layout_.Fingerprint()) {
      bad = absl::DataLossError("it holds another block, seed or layout");
    } else if (XXH3_64bits(buf.data() + hb, static_cast<size_t>(payload_bytes_)) !=
               h.payload_xxh3) {
      bad = absl::DataLossError("its K/V fail their checksum");
    } else if (tokens.size() != static_cast<size_t>(layout_.block_size) ||
               std::memcmp(stored_tokens, tokens.data(), token_bytes) != 0) {
      other_tokens = true;  // a hash collision: not ours, and not corrupt
    }
  }
  {
    absl::MutexLock lock(&mu_);
    --slots_[static_cast<size_t>(slot)].readers;
    if (!got.ok()) {
      ++stats_.io_errors;
      TurnOff(got.status());
      return absl::UnavailableError(absl::StrCat("kv disk tier: ", got.status().message()));
    }
    if (!bad.ok()) {
      ++stats_.dropped_corrupt;
      DUET_LOG(WARNING) << "kv disk tier " << options_.path << ": slot " << slot << " (block "
                        << hash.ToHex() << ") dropped: " << bad.message();
      if (slots_[static_cast<size_t>(slot)].valid &&
          slots_[static_cast<size_t>(slot)].hash == hash) {
        Drop(slot);
        // Its header goes too, so that a restart does not find it again (rare: under the lock,
        // before the writer may take the slot).
        const std::vector<uint8_t> zeros(static_cast<size_t>(hb), 0);
        if (::pwrite(fd_.get(), zeros.data(), zeros.size(), slot * slot_bytes_) !=
            static_cast<ssize_t>(zeros.size())) {
          DUET_LOG(WARNING) << "kv disk tier " << options_.path << ": clearing slot " << slot
                            << "'s header: " << std::strerror(errno);
        }
        free_.push_back(slot);
      }
      return absl::DataLossError(absl::StrCat("kv disk tier: block ", hash.ToHex(), " in slot ",
                                              slot, ": ", bad.message()));
    }
    if (other_tokens) {
      return absl::NotFoundError(
          absl::StrCat("kv disk tier: block ", hash.ToHex(), " holds other token ids"));
    }
    ++stats_.loaded;
    stats_.loaded_bytes += hb + payload_bytes_;
  }
  const size_t bb = layout_.BlockBytes();
  for (int l = 0; l < layout_.num_layers; ++l) {
    std::memcpy(pool.BlockAddress(l, id), buf.data() + hb + static_cast<size_t>(l) * bb, bb);
  }
  return absl::OkStatus();
}

bool DiskTier::WaitIdle(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithDeadline(absl::Condition(
                                   +[](DiskTier* t) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                     return t->queued_.empty() && t->dropped_.empty() &&
                                            t->notifying_ == 0;
                                   },
                                   this),
                               deadline);
}

DiskTierStats DiskTier::Stats() const {
  absl::MutexLock lock(&mu_);
  DiskTierStats s = stats_;
  s.enabled = enabled_;
  s.held = static_cast<int64_t>(index_.size());
  return s;
}

int64_t DiskTier::TakeSlot() {
  if (!free_.empty()) {
    const int64_t s = free_.back();
    free_.pop_back();
    return s;
  }
  for (int64_t s : lru_) {
    if (slots_[static_cast<size_t>(s)].readers == 0) {
      Drop(s);
      ++stats_.overwritten;
      return s;
    }
  }
  return -1;
}

void DiskTier::Drop(int64_t slot) {
  Slot& s = slots_[static_cast<size_t>(slot)];
  if (!s.valid) return;
  dropped_.push_back(s.hash);
  index_.erase(s.hash);
  lru_.erase(s.lru);
  s.valid = false;
}

void DiskTier::Touch(int64_t slot) {
  Slot& s = slots_[static_cast<size_t>(slot)];
  if (s.valid) lru_.splice(lru_.end(), lru_, s.lru);
}

void DiskTier::TurnOff(const absl::Status& why) {
  if (!enabled_) return;
  enabled_ = false;
  DUET_LOG(ERROR) << "kv disk tier " << options_.path
                  << " turned off; serving goes on without it: " << why;
  // Everything it held leaves the node's cache, and what was queued is never written.
  for (const auto& [hash, slot] : index_) dropped_.push_back(hash);
  for (const std::shared_ptr<const Staged>& s : queue_) {
    queued_.erase(s->hash);
    dropped_.push_back(s->hash);
  }
  staged_bytes_ -= payload_bytes_ * static_cast<int64_t>(queue_.size());
  queue_.clear();
}

}  // namespace duet::kv
