#include "transfer/peer_address.h"

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"

namespace duet::transfer {
namespace {

constexpr char kMagic[8] = {'D', 'U', 'E', 'T', 'X', 'F', 'R', '1'};

void PutU64(std::string& out, uint64_t v) {
  char b[8];
  std::memcpy(b, &v, 8);
  out.append(b, 8);
}
void PutStr(std::string& out, const std::string& s) {
  PutU64(out, s.size());
  out.append(s);
}

class Reader {
 public:
  explicit Reader(const std::string& s) : s_(s) {}
  absl::StatusOr<uint64_t> U64() {
    if (pos_ + 8 > s_.size()) return Truncated();
    uint64_t v;
    std::memcpy(&v, s_.data() + pos_, 8);
    pos_ += 8;
    return v;
  }
  absl::StatusOr<std::string> Str() {
    DUET_ASSIGN_OR_RETURN(uint64_t n, U64());
    if (n > s_.size() - pos_) return Truncated();
    std::string v = s_.substr(pos_, n);
    pos_ += n;
    return v;
  }
  bool done() const { return pos_ == s_.size(); }

 private:
  absl::Status Truncated() const {
    return absl::InvalidArgumentError(
        absl::StrCat("peer address: truncated at byte ", pos_, " of ", s_.size()));
  }
  const std::string& s_;
  size_t pos_ = sizeof(kMagic);
};

}  // namespace

std::string EncodePeerAddress(const PeerAddress& a) {
  std::string out(kMagic, sizeof(kMagic));
  PutStr(out, a.backend);
  PutStr(out, a.name);
  PutU64(out, a.instance);
  PutStr(out, a.layout.model_id);
  PutU64(out, static_cast<uint64_t>(a.layout.num_layers));
  PutU64(out, static_cast<uint64_t>(a.layout.num_kv_heads));
  PutU64(out, static_cast<uint64_t>(a.layout.head_dim));
  PutU64(out, static_cast<uint64_t>(a.layout.block_size));
  PutU64(out, static_cast<uint64_t>(a.layout.dtype));
  PutU64(out, a.layout.Fingerprint());
  PutU64(out, a.region_base);
  PutU64(out, a.region_bytes);
  PutStr(out, a.worker_address);
  PutStr(out, a.region_key);
  PutStr(out, a.host);
  PutU64(out, a.pid);
  PutU64(out, a.start_time);
  PutStr(out, a.write_mode);
  return out;
}

absl::StatusOr<PeerAddress> DecodePeerAddress(const std::string& blob) {
  if (blob.size() < sizeof(kMagic) || std::memcmp(blob.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer address: not a duet transfer address (", blob.size(), " bytes)"));
  }
  Reader r(blob);
  PeerAddress a;
  DUET_ASSIGN_OR_RETURN(a.backend, r.Str());
  DUET_ASSIGN_OR_RETURN(a.name, r.Str());
  DUET_ASSIGN_OR_RETURN(a.instance, r.U64());
  DUET_ASSIGN_OR_RETURN(a.layout.model_id, r.Str());
  DUET_ASSIGN_OR_RETURN(uint64_t layers, r.U64());
  DUET_ASSIGN_OR_RETURN(uint64_t heads, r.U64());
  DUET_ASSIGN_OR_RETURN(uint64_t dim, r.U64());
  DUET_ASSIGN_OR_RETURN(uint64_t block, r.U64());
  DUET_ASSIGN_OR_RETURN(uint64_t dtype, r.U64());
  DUET_ASSIGN_OR_RETURN(uint64_t fingerprint, r.U64());
  a.layout.num_layers = static_cast<int>(layers);
  a.layout.num_kv_heads = static_cast<int>(heads);
  a.layout.head_dim = static_cast<int>(dim);
  a.layout.block_size = static_cast<int>(block);
  a.layout.dtype = static_cast<kv::KvDtype>(dtype);
  if (dtype > 255 || kv::KvDtypeBytes(a.layout.dtype) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer address of '", a.name, "': unknown KV dtype code ", dtype));
  }
  if (a.layout.Fingerprint() != fingerprint) {
    return absl::InvalidArgumentError(absl::StrCat(
        "peer address of '", a.name, "': layout fingerprint does not match its fields"));
  }
  DUET_ASSIGN_OR_RETURN(a.region_base, r.U64());
  DUET_ASSIGN_OR_RETURN(a.region_bytes, r.U64());
  DUET_ASSIGN_OR_RETURN(a.worker_address, r.Str());
  DUET_ASSIGN_OR_RETURN(a.region_key, r.Str());
  DUET_ASSIGN_OR_RETURN(a.host, r.Str());
  DUET_ASSIGN_OR_RETURN(a.pid, r.U64());
  DUET_ASSIGN_OR_RETURN(a.start_time, r.U64());
  DUET_ASSIGN_OR_RETURN(a.write_mode, r.Str());
  if (!r.done()) return absl::InvalidArgumentError("peer address: trailing bytes");
  return a;
}

namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// State letter and start time (field 22) of /proc/<pid>/stat; false if unreadable.
bool ReadProcStat(uint64_t pid, char* state, uint64_t* start_time) {
  const std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat.size()) return false;
  std::istringstream rest(stat.substr(paren + 2));
  std::string field;
  // Field 3 is the state; field 22 is the start time.
  for (int i = 3; i <= 22; ++i) {
    if (!(rest >> field)) return false;
    if (i == 3) *state = field[0];
  }
  *start_time = std::strtoull(field.c_str(), nullptr, 10);
  return true;
}

const std::string& BootId() {
  static const std::string* id = [] {
    std::string s = ReadFile("/proc/sys/kernel/random/boot_id");
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    if (s.empty()) {
      char host[256] = {0};
      gethostname(host, sizeof(host) - 1);
      s = host;
    }
    return new std::string(s);
  }();
  return *id;
}

}  // namespace

void FillProcessIdentity(PeerAddress& a) {
  a.host = BootId();
  a.pid = static_cast<uint64_t>(getpid());
  char state = 0;
  a.start_time = 0;
  ReadProcStat(a.pid, &state, &a.start_time);
}

bool PeerProcessAlive(const PeerAddress& a) {
  if (a.host.empty() || a.host != BootId() || a.pid == 0) return true;
  char state = 0;
  uint64_t start = 0;
  if (!ReadProcStat(a.pid, &state, &start)) return false;
  if (state == 'Z' || state == 'X') return false;
  return start == a.start_time;
}

uint64_t NewInstanceId() {
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ (counter.fetch_add(1) << 1);
  return v == 0 ? 1 : v;
}

}  // namespace duet::transfer
