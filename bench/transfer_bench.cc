// transfer_bench: KV transfer over UCX between two processes on loopback (this one sends, a
// child started as --role=receiver receives), sweeping KV geometry x prompt length x block size x
// transport (shm, tcp). Per configuration: bulk time and GB/s, per-layer latency p50/p99, the
// ratio to ucx_perftest (best of put/tag/am over the same transport, run in the same invocation,
// at the same message size (the chunk) and with one whole layer as the message) and to a
// single-thread memcpy, and the pipelined case: with a simulated
// per-layer compute time equal to one layer's transfer time, the time from the last layer
// computed to the request ready on the receiver, pipelined vs bulk after the last layer. The
// pipelined run posts each layer where the engine's layer-done hook fires (after the QKV
// projection, before attention and the MLP: `hook_fraction` of the layer's FLOPs), and again at
// the layer's end, to show what that placement hides.
//
//   transfer_bench --quick --json /tmp/transfer.json        # a subset, < 30 s
//   transfer_bench --transports=shm --geometries=llama3-8b  # one slice of the full sweep
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/base/clock.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "common/base/stream_copy.h"
#include "common/kv/block_pool.h"
#include "transfer/kv_stream/kv_notice.h"
#include "transfer/kv_stream/kv_stream_sender.h"
#include "transfer/transport.h"
#include "transfer/ucx/ucx_transport.h"

ABSL_FLAG(bool, quick, false, "run a small subset (under 30 s)");
ABSL_FLAG(std::string, json, "", "write results as JSON to this file");
ABSL_FLAG(std::string, transports, "shm,tcp", "ucx profiles to sweep");
ABSL_FLAG(std::string, geometries, "tiny,llama3-8b,llama3-70b",
          "KV geometries to sweep (tiny, smollm2-135m, llama3-8b, llama3-70b)");
ABSL_FLAG(std::string, kv_dtypes, "",
          "KV dtypes to sweep each geometry in (f32, bf16, f16, int8, fp8; empty: the "
          "geometry's own); a geometry in dtype D is named GEOMETRY-D");
ABSL_FLAG(std::string, prompts, "128,512,2048,8192", "prompt lengths (tokens)");
ABSL_FLAG(std::string, block_sizes, "16,32", "tokens per block");
ABSL_FLAG(int, iters, 5, "measured iterations per mode");
ABSL_FLAG(bool, perftest, true, "run ucx_perftest for the reference bandwidth");
ABSL_FLAG(int64_t, idle_spin_us, 200,
          "progress thread: poll this long before sleeping (-1: never sleep)");
ABSL_FLAG(std::string, write_mode, "auto", "transport write mode: auto, put, am");
ABSL_FLAG(int64_t, am_eager_kib, 4096,
          "am-lane chunks up to this size are sent eagerly, as <= 48 KiB messages (KiB)");
ABSL_FLAG(int64_t, chunk_kib, 1024, "put-lane chunk size (KiB)");
ABSL_FLAG(int64_t, am_chunk_kib, 4096,
          "am-lane chunk size (KiB); above --am_eager_kib one rendezvous message");
ABSL_FLAG(int64_t, max_bytes, int64_t{1} << 30, "skip configurations whose KV exceeds this");
// Receiver role (internal).
ABSL_FLAG(std::string, role, "sender", "internal: sender or receiver");
ABSL_FLAG(std::string, dir, "", "internal: exchange directory");
ABSL_FLAG(std::string, profile, "shm", "internal: ucx profile");
ABSL_FLAG(std::string, layout, "", "internal: model,layers,heads,dim,block,dtype");
ABSL_FLAG(int64_t, blocks, 0, "internal: pool blocks");

namespace duet::transfer {
namespace {

using nlohmann::json;

struct Geometry {
  std::string name;
  int layers, heads, dim;
  kv::KvDtype dtype;
  int hidden, q_heads, intermediate;  // the model around the KV, for the hook's position

  // Share of a layer's weight FLOPs spent before the engine's layer-done hook fires: the hook
  // runs right after the layer's K/V are written, i.e. after the QKV projection and before
  // attention, the output projection and the MLP (ModelRunner). Attention FLOPs, which grow
  // with the prompt, are left out, so this overstates the share (conservative).
  double HookFraction() const {
    const double qkv = double(hidden) * (q_heads + 2 * heads) * dim;
    const double o = double(hidden) * q_heads * dim;
    const double mlp = 3.0 * hidden * intermediate;
    return qkv / (qkv + o + mlp);
  }
};
const Geometry kGeometries[] = {
    {"tiny", 2, 2, 16, kv::KvDtype::kF32, 64, 4, 128},
    {"smollm2-135m", 30, 3, 64, kv::KvDtype::kF32, 576, 9, 1536},
    {"llama3-8b", 32, 8, 128, kv::KvDtype::kBF16, 4096, 32, 14336},
    {"llama3-70b", 80, 8, 128, kv::KvDtype::kBF16, 8192, 64, 28672},
};

std::string EncodeLayout(const kv::KvLayout& l) {
  return absl::StrCat(l.model_id, ",", l.num_layers, ",", l.num_kv_heads, ",", l.head_dim, ",",
                      l.block_size, ",", static_cast<int>(l.dtype));
}
kv::KvLayout DecodeLayout(const std::string& s) {
  std::vector<std::string> f = absl::StrSplit(s, ',');
  kv::KvLayout l;
  l.model_id = f.at(0);
  l.num_layers = std::stoi(f.at(1));
  l.num_kv_heads = std::stoi(f.at(2));
  l.head_dim = std::stoi(f.at(3));
  l.block_size = std::stoi(f.at(4));
  l.dtype = static_cast<kv::KvDtype>(std::stoi(f.at(5)));
  return l;
}

bool WriteFile(const std::string& path, const std::string& s) {
  {
    std::ofstream out(path + ".tmp", std::ios::binary);
    out << s;
    if (!out) return false;
  }
  return std::rename((path + ".tmp").c_str(), path.c_str()) == 0;
}
absl::StatusOr<std::string> WaitFile(const std::string& path, absl::Time deadline) {
  while (!std::filesystem::exists(path)) {
    if (absl::Now() > deadline) return absl::DeadlineExceededError("no " + path);
    absl::SleepFor(absl::Milliseconds(1));
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(const std::string& profile_name,
                                                         const std::string& name,
                                                         const kv::KvLayout& layout) {
  DUET_ASSIGN_OR_RETURN(UcxProfile profile, UcxProfileByName(profile_name));
  TransportOptions options{
      .name = name, .layout = layout, .tls = profile.tls, .net_devices = profile.net_devices};
  const int64_t spin = absl::GetFlag(FLAGS_idle_spin_us);
  DUET_ASSIGN_OR_RETURN(options.write_mode, ParseWriteMode(absl::GetFlag(FLAGS_write_mode)));
  options.am_eager_max_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_am_eager_kib)) << 10;
  options.chunk_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_chunk_kib)) << 10;
  options.am_chunk_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_am_chunk_kib)) << 10;
  options.idle_spin = spin < 0 ? absl::InfiniteDuration() : absl::Microseconds(spin);
  return CreateTransport("ucx", options);
}

// ---------------------------------------------------------------------------------------------
// Receiver: timestamps every notice; acks each final notice back to the sender.

int RunReceiver() {
  SetMinLogLevel(LogLevel::kWarning);
  const std::string dir = absl::GetFlag(FLAGS_dir);
  const kv::KvLayout layout = DecodeLayout(absl::GetFlag(FLAGS_layout));
  const int64_t blocks = absl::GetFlag(FLAGS_blocks);
  auto fail = [&](const absl::Status& s) {
    WriteFile(dir + "/recv.err", std::string(s.message()));
    return 2;
  };
  auto t = MakeTransport(absl::GetFlag(FLAGS_profile), "bench-receiver", layout);
  if (!t.ok()) return fail(t.status());
  auto region = (*t)->AllocateRegion(layout.RegionBytes(blocks));  // UCX-allocated (shm) pool
  if (!region.ok()) return fail(region.status());
  WriteFile(dir + "/recv.addr", *(*t)->LocalAddress());
  auto send_addr = WaitFile(dir + "/send.addr", DeadlineIn(absl::Seconds(60)));
  if (!send_addr.ok()) return fail(send_addr.status());
  auto back = (*t)->Connect(*send_addr, DeadlineIn(absl::Seconds(30)));
  if (!back.ok()) return fail(back.status());
  std::string log;
  while (!std::filesystem::exists(dir + "/stop")) {
    (*t)->WaitForNotices(DeadlineIn(absl::Milliseconds(5)));
    for (const Notice& n : (*t)->DrainNotices()) {
      const int64_t now = MonotonicNanos();
      auto kn = DecodeKvNotice(n.payload);
      if (!kn.ok()) continue;
      absl::StrAppend(&log, static_cast<int>(kn->kind), " ", kn->request_id, " ", kn->layer, " ",
                      now, "\n");
      if (kn->kind == KvNoticeKind::kFinal) {
        auto h = (*t)->PostWrite(
            *back, {},
            EncodeKvNotice({.kind = KvNoticeKind::kFinal, .request_id = kn->request_id}));
        if (!h.ok()) return fail(h.status());
      }
    }
  }
  WriteFile(dir + "/recv.log", log);
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Reference bandwidths.

double MemcpyGBps(size_t bytes) {
  bytes = std::max<size_t>(bytes, 4096);
  std::vector<uint8_t> a(bytes, 1), b(bytes, 2);
  std::memcpy(b.data(), a.data(), bytes);
  const int reps = static_cast<int>(std::clamp<size_t>((size_t{256} << 20) / bytes, 3, 2000));
  Stopwatch sw;
  for (int i = 0; i < reps; ++i) {
    a[i % bytes] = static_cast<uint8_t>(i);
    std::memcpy(b.data(), a.data(), bytes);
  }
  return static_cast<double>(bytes) * reps / sw.ElapsedSeconds() / 1e9;
}

// What one thread can move through memory for a whole request's KV: `bytes` copied 1 MiB at a
// time from one buffer to another (the best of memcpy and StreamingCopy, two passes each). At
// 8B/70B sizes both buffers are far larger than the caches, as the stream's pools are, unlike
// ucx_perftest, which re-sends one cache-resident buffer.
double WholeKvCopyGBps(size_t bytes) {
  bytes = std::max<size_t>(bytes, 4096);
  std::vector<uint8_t> a(bytes, 1), b(bytes, 2);
  constexpr size_t kChunk = 1 << 20;
  double best = 0;
  for (int pass = 0; pass < 4; ++pass) {
    Stopwatch sw;
    for (size_t o = 0; o < bytes; o += kChunk) {
      const size_t n = std::min(kChunk, bytes - o);
      if (pass % 2 == 0) {
        std::memcpy(b.data() + o, a.data() + o, n);
      } else {
        StreamingCopy(b.data() + o, a.data() + o, n);
      }
    }
    best = std::max(best, static_cast<double>(bytes) / sw.ElapsedSeconds() / 1e9);
  }
  return best;
}

// ucx_perftest's overall bandwidth (GB/s; it prints MiB/s) for `test` at `size` bytes, or -1.
double Perftest(const std::string& profile_name, const std::string& test, size_t size) {
  static int port_seq = 0;
  const int port = 20000 + (getpid() % 20000) + (port_seq++ % 500);
  auto profile = UcxProfileByName(profile_name);
  std::string env = absl::StrCat("UCX_TLS=", profile->tls);
  if (!profile->net_devices.empty())
    absl::StrAppend(&env, " UCX_NET_DEVICES=", profile->net_devices);
  const size_t iters = std::clamp<size_t>((size_t{192} << 20) / size, 20, 20000);
  const std::string server =
      absl::StrCat("exec env ", env, " timeout 30 ucx_perftest -p ", port, " > /dev/null 2>&1");
  pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", server.c_str(), nullptr);
    _exit(127);
  }
  absl::SleepFor(absl::Milliseconds(300));
  const std::string client =
      absl::StrCat(env, " timeout 30 ucx_perftest 127.0.0.1 -p ", port, " -t ", test, " -s ", size,
                   " -n ", iters, " -w ", std::min<size_t>(iters / 10 + 1, 100), " -f 2>&1");
  double mibps = -1;
  if (FILE* p = popen(client.c_str(), "r")) {
    char line[512];
    while (fgets(line, sizeof(line), p) != nullptr) {
      std::vector<std::string> tok = absl::StrSplit(line, ' ', absl::SkipWhitespace());
      double v;
      if (tok.size() == 8 && absl::SimpleAtod(tok[5], &v)) mibps = v;
    }
    pclose(p);
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return mibps < 0 ? -1 : mibps * 1048576.0 / 1e9;
}

struct PerftestBest {
  double gbps = -1;
  std::string test;
};
PerftestBest BestPerftest(const std::string& profile, size_t size) {
  static std::map<std::pair<std::string, size_t>, PerftestBest> cache;
  auto key = std::make_pair(profile, size);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  PerftestBest best;
  // UCX emulates put over tcp (~0.08 GB/s in ucx_perftest on loopback): not worth its run time.
  std::vector<std::string> tests = {"ucp_am_bw", "tag_bw"};
  if (profile == "shm") tests.insert(tests.begin(), "ucp_put_bw");
  for (const std::string& t : tests) {
    const double g = Perftest(profile, t, size);
    if (g > best.gbps) best = {g, t};
  }
  cache[key] = best;
  return best;
}

// ---------------------------------------------------------------------------------------------
// Sender: one configuration.

struct Config {
  Geometry geometry;
  std::string transport;
  int prompt;
  int block;
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}
double Median(std::vector<double> v) { return Percentile(std::move(v), 0.5); }

absl::StatusOr<json> RunConfig(const Config& c, int iters) {
  const kv::KvLayout layout{.model_id = c.geometry.name,
                            .num_layers = c.geometry.layers,
                            .num_kv_heads = c.geometry.heads,
                            .head_dim = c.geometry.dim,
                            .block_size = c.block,
                            .dtype = c.geometry.dtype};
  const int64_t n = layout.BlocksForTokens(c.prompt);
  const int L = layout.num_layers;
  const uint64_t layer_bytes = static_cast<uint64_t>(n) * layout.BlockBytes();
  const uint64_t total_bytes = layer_bytes * L;

  char tmpl[] = "/tmp/duet_transfer_bench_XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return absl::InternalError("mkdtemp");
  const std::string dir = tmpl;
  pid_t pid = fork();
  if (pid == 0) {
    const std::string exe = std::filesystem::read_symlink("/proc/self/exe");
    std::vector<std::string> args = {
        exe,
        "--role=receiver",
        "--dir=" + dir,
        "--profile=" + c.transport,
        "--layout=" + EncodeLayout(layout),
        absl::StrCat("--blocks=", n),
        absl::StrCat("--idle_spin_us=", absl::GetFlag(FLAGS_idle_spin_us)),
        absl::StrCat("--am_eager_kib=", absl::GetFlag(FLAGS_am_eager_kib)),
        absl::StrCat("--chunk_kib=", absl::GetFlag(FLAGS_chunk_kib)),
        absl::StrCat("--am_chunk_kib=", absl::GetFlag(FLAGS_am_chunk_kib))};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  struct Cleanup {
    pid_t pid;
    std::string dir;
    ~Cleanup() {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup{pid, dir};

  DUET_ASSIGN_OR_RETURN(auto t, MakeTransport(c.transport, "bench-sender", layout));
  DUET_ASSIGN_OR_RETURN(auto pool, kv::BlockPool::Create(layout, n));  // heap, like a CPU prefill
  std::memset(pool->region(), 0x5a, pool->region_bytes());
  DUET_ASSIGN_OR_RETURN(auto region, t->Register(pool->region(), pool->region_bytes()));
  DUET_ASSIGN_OR_RETURN(std::string addr, t->LocalAddress());
  WriteFile(dir + "/send.addr", addr);
  auto recv_addr = WaitFile(dir + "/recv.addr", DeadlineIn(absl::Seconds(180)));
  if (!recv_addr.ok()) {
    auto err = WaitFile(dir + "/recv.err", absl::Now());
    return absl::UnavailableError(err.ok() ? *err : std::string(recv_addr.status().message()));
  }
  DUET_ASSIGN_OR_RETURN(PeerId peer, t->Connect(*recv_addr, DeadlineIn(absl::Seconds(30))));
  DUET_ASSIGN_OR_RETURN(PeerInfo info, t->GetPeerInfo(peer));
  DUET_ASSIGN_OR_RETURN(auto sender, KvStreamSender::Create(t.get(), layout, n));
  std::vector<kv::BlockId> blocks(n);
  for (int64_t i = 0; i < n; ++i) blocks[i] = static_cast<kv::BlockId>(i);

  // Post times per (request, layer), and the moment the last layer was "computed".
  std::map<uint64_t, std::vector<int64_t>> post_ns;
  std::map<uint64_t, int64_t> last_compute_ns, start_ns;
  uint64_t next_id = 1;
  const absl::Duration timeout = absl::Seconds(120);

  auto wait_ack = [&](uint64_t id) -> absl::Status {
    const absl::Time deadline = DeadlineIn(timeout);
    while (true) {
      for (const Notice& nt : t->DrainNotices()) {
        auto kn = DecodeKvNotice(nt.payload);
        if (kn.ok() && kn->request_id == id) return sender->Wait(id, deadline);
      }
      if (!t->WaitForNotices(deadline)) return absl::DeadlineExceededError("no ack from receiver");
    }
  };
  // mode: 0 bulk (no compute); 1 pipelined with `compute` per layer, the layer's writes posted
  // `hook` of the way through it (1.0: at its end); 2 compute all layers, then bulk.
  auto run = [&](int mode, absl::Duration compute, double hook) -> absl::StatusOr<uint64_t> {
    const uint64_t id = next_id++;
    DUET_RETURN_IF_ERROR(sender->Begin({id, peer, blocks, blocks}));
    std::vector<int64_t>& posts = post_ns[id];
    posts.assign(L, 0);
    start_ns[id] = MonotonicNanos();
    if (mode == 2) absl::SleepFor(compute * L);
    for (int l = 0; l < L; ++l) {
      if (mode == 1) absl::SleepFor(compute * hook);
      posts[l] = MonotonicNanos();
      const uint64_t ids[] = {id};
      DUET_RETURN_IF_ERROR(sender->OnLayerDone(l, ids));
      if (mode == 1 && hook < 1.0) absl::SleepFor(compute * (1.0 - hook));
    }
    last_compute_ns[id] = mode == 0 ? start_ns[id] : (mode == 1 ? MonotonicNanos() : posts[0]);
    DUET_RETURN_IF_ERROR(sender->Finish(id, "tok"));
    DUET_RETURN_IF_ERROR(wait_ack(id));
    return id;
  };

  DUET_RETURN_IF_ERROR(run(0, absl::ZeroDuration(), 1.0).status());  // warm-up
  std::vector<uint64_t> bulk_ids, pipe_ids, end_ids, after_ids;
  for (int i = 0; i < iters; ++i) {
    DUET_ASSIGN_OR_RETURN(uint64_t id, run(0, absl::ZeroDuration(), 1.0));
    bulk_ids.push_back(id);
  }
  // Arrival times of every notice, from the receiver's log (read once, at the end).
  auto read_log =
      [&]() -> absl::StatusOr<std::map<uint64_t, std::pair<std::vector<int64_t>, int64_t>>> {
    WriteFile(dir + "/stop", "");
    DUET_ASSIGN_OR_RETURN(std::string text,
                          WaitFile(dir + "/recv.log", DeadlineIn(absl::Seconds(30))));
    std::map<uint64_t, std::pair<std::vector<int64_t>, int64_t>> arrivals;  // layers, final
    std::istringstream in(text);
    int kind;
    uint64_t id;
    int layer;
    int64_t ns;
    while (in >> kind >> id >> layer >> ns) {
      auto& a = arrivals[id];
      if (a.first.empty()) a.first.assign(L, 0);
      if (kind == 1 && layer >= 0 && layer < L) a.first[layer] = ns;
      if (kind == 2) a.second = ns;
    }
    return arrivals;
  };
  auto ready_ns = [&](const std::pair<std::vector<int64_t>, int64_t>& a) {
    int64_t r = a.second;
    for (int64_t x : a.first) r = std::max(r, x);
    return r;
  };
  // Compute time per layer = one layer's transfer time, estimated from a sender-side timed bulk
  // run (the ack adds one small message).
  Stopwatch est;
  DUET_ASSIGN_OR_RETURN(uint64_t est_id, run(0, absl::ZeroDuration(), 1.0));
  (void)est_id;
  const absl::Duration compute = absl::Nanoseconds(est.ElapsedNanos() / L);
  const double hook = c.geometry.HookFraction();
  for (int i = 0; i < std::max(2, iters / 2); ++i) {
    DUET_ASSIGN_OR_RETURN(uint64_t p, run(1, compute, hook));
    pipe_ids.push_back(p);
    DUET_ASSIGN_OR_RETURN(uint64_t e, run(1, compute, 1.0));
    end_ids.push_back(e);
    DUET_ASSIGN_OR_RETURN(uint64_t a, run(2, compute, 1.0));
    after_ids.push_back(a);
  }
  DUET_ASSIGN_OR_RETURN(auto arrivals, read_log());

  std::vector<double> bulk_ms, layer_lat_us, pipe_tail_ms, end_tail_ms, after_tail_ms;
  for (uint64_t id : bulk_ids) bulk_ms.push_back((ready_ns(arrivals[id]) - start_ns[id]) / 1e6);
  for (uint64_t id : pipe_ids) {
    for (int l = 0; l < L; ++l) {
      layer_lat_us.push_back((arrivals[id].first[l] - post_ns[id][l]) / 1e3);
    }
    pipe_tail_ms.push_back((ready_ns(arrivals[id]) - last_compute_ns[id]) / 1e6);
  }
  for (uint64_t id : end_ids) {
    end_tail_ms.push_back((ready_ns(arrivals[id]) - last_compute_ns[id]) / 1e6);
  }
  for (uint64_t id : after_ids) {
    after_tail_ms.push_back((ready_ns(arrivals[id]) - last_compute_ns[id]) / 1e6);
  }
  const double total_ms = Median(bulk_ms);
  const double gbps = total_bytes / (total_ms / 1e3) / 1e9;
  const uint64_t chunk = static_cast<uint64_t>(info.lane == "am" ? absl::GetFlag(FLAGS_am_chunk_kib)
                                                                 : absl::GetFlag(FLAGS_chunk_kib))
                         << 10;
  const size_t msg = static_cast<size_t>(std::min<uint64_t>(layer_bytes, chunk));
  PerftestBest ref;
  if (absl::GetFlag(FLAGS_perftest)) ref = BestPerftest(c.transport, msg);
  // The same at one whole layer's write as the message: perftest's buffers are then as large as
  // what a layer moves, so at 8B/70B sizes they no longer sit in the caches (the KV pools do
  // not either). Reported beside the chunk-size reference, not instead of it.
  PerftestBest ref_layer = ref;
  if (absl::GetFlag(FLAGS_perftest) && layer_bytes > msg) {
    ref_layer = BestPerftest(c.transport, static_cast<size_t>(layer_bytes));
  }
  const double memcpy_gbps = MemcpyGBps(layer_bytes);
  const double whole_copy_gbps = WholeKvCopyGBps(total_bytes);
  const double one_layer_ms = total_ms / L;
  json row = {
      {"geometry", c.geometry.name},
      {"kv_dtype", kv::KvDtypeName(c.geometry.dtype)},
      {"kv_bytes_per_token", layout.BytesForTokens(1)},
      {"transport", c.transport},
      {"lane", info.lane},
      {"prompt_tokens", c.prompt},
      {"block_size", c.block},
      {"layers", L},
      {"layer_bytes", layer_bytes},
      {"total_bytes", total_bytes},
      {"message_bytes", msg},
      {"total_ms", total_ms},
      {"gbps", gbps},
      {"layer_latency_p50_us", Percentile(layer_lat_us, 0.5)},
      {"layer_latency_p99_us", Percentile(layer_lat_us, 0.99)},
      {"perftest_gbps", ref.gbps},
      {"perftest_test", ref.test},
      {"ratio_to_perftest", ref.gbps > 0 ? gbps / ref.gbps : -1},
      {"perftest_layer_message_gbps", ref_layer.gbps},
      {"perftest_layer_message_test", ref_layer.test},
      {"ratio_to_perftest_layer_message", ref_layer.gbps > 0 ? gbps / ref_layer.gbps : -1},
      {"memcpy_gbps", memcpy_gbps},
      {"ratio_to_memcpy", gbps / memcpy_gbps},
      {"whole_kv_copy_gbps", whole_copy_gbps},
      {"ratio_to_whole_kv_copy", gbps / whole_copy_gbps},
      {"compute_per_layer_ms", absl::ToDoubleMilliseconds(compute)},
      {"one_layer_transfer_ms", one_layer_ms},
      {"hook_fraction", hook},
      {"pipelined_tail_ms", Median(pipe_tail_ms)},
      {"pipelined_tail_hook_at_layer_end_ms", Median(end_tail_ms)},
      {"bulk_after_tail_ms", Median(after_tail_ms)},
      {"pipelined_tail_in_layers", Median(pipe_tail_ms) / one_layer_ms},
      {"pipelined_tail_hook_at_layer_end_in_layers", Median(end_tail_ms) / one_layer_ms},
  };
  return row;
}

int RunSweep() {
  SetMinLogLevel(LogLevel::kError);  // receivers are killed at the end of each configuration
  const bool quick = absl::GetFlag(FLAGS_quick);
  std::vector<Config> configs;
  if (quick) {
    for (const std::string tr : {"shm", "tcp"}) {
      configs.push_back({kGeometries[0], tr, 512, 16});
      configs.push_back({kGeometries[1], tr, 512, 16});
      configs.push_back({kGeometries[1], tr, 2048, 16});
    }
  } else {
    std::vector<std::string> trs = absl::StrSplit(absl::GetFlag(FLAGS_transports), ',');
    std::vector<std::string> geos = absl::StrSplit(absl::GetFlag(FLAGS_geometries), ',');
    std::vector<std::string> prompts = absl::StrSplit(absl::GetFlag(FLAGS_prompts), ',');
    std::vector<std::string> bss = absl::StrSplit(absl::GetFlag(FLAGS_block_sizes), ',');
    std::vector<Geometry> swept;
    for (const Geometry& g : kGeometries) {
      if (std::find(geos.begin(), geos.end(), g.name) == geos.end()) continue;
      if (absl::GetFlag(FLAGS_kv_dtypes).empty()) {
        swept.push_back(g);
        continue;
      }
      for (absl::string_view d : absl::StrSplit(absl::GetFlag(FLAGS_kv_dtypes), ',')) {
        absl::StatusOr<kv::KvDtype> dtype = kv::ParseKvDtype(std::string(d));
        if (!dtype.ok()) {
          std::fprintf(stderr, "transfer_bench: --kv_dtypes: %s\n",
                       std::string(dtype.status().message()).c_str());
          return 2;
        }
        Geometry v = g;
        v.dtype = *dtype;
        v.name = absl::StrCat(g.name, "-", kv::KvDtypeName(*dtype));
        swept.push_back(v);
      }
    }
    for (const std::string& tr : trs)
      for (const Geometry& g : swept) {
        for (const std::string& p : prompts)
          for (const std::string& b : bss) configs.push_back({g, tr, std::stoi(p), std::stoi(b)});
      }
  }
  const int iters = quick ? 3 : absl::GetFlag(FLAGS_iters);
  json rows = json::array();
  std::printf(
      "%-17s %-4s %-6s %6s %3s %9s %9s %7s %9s %9s %8s %6s %8s %6s %7s %6s %7s %6s %9s %9s %6s "
      "%9s\n",
      "geometry", "tr", "lane", "prompt", "bs", "layer_KiB", "total_ms", "GB/s", "lat_p50us",
      "lat_p99us", "pt_GB/s", "x_pt", "ptL_GB/s", "x_ptL", "mc_GB/s", "x_mc", "kv_GB/s", "x_kv",
      "pipe_tail", "bulk_tail", "tail_L", "end_tail_L");
  for (const Config& c : configs) {
    const kv::KvLayout l{.model_id = c.geometry.name,
                         .num_layers = c.geometry.layers,
                         .num_kv_heads = c.geometry.heads,
                         .head_dim = c.geometry.dim,
                         .block_size = c.block,
                         .dtype = c.geometry.dtype};
    const uint64_t bytes = l.RegionBytes(l.BlocksForTokens(c.prompt));
    if (bytes > static_cast<uint64_t>(absl::GetFlag(FLAGS_max_bytes))) continue;
    auto row = RunConfig(c, iters);
    if (!row.ok()) {
      std::printf("%-17s %-4s %6d %3d  FAILED: %s\n", c.geometry.name.c_str(), c.transport.c_str(),
                  c.prompt, c.block, std::string(row.status().message()).c_str());
      continue;
    }
    const json& r = *row;
    std::printf(
        "%-17s %-4s %-6s %6d %3d %9.0f %9.2f %7.2f %9.0f %9.0f %8.2f %6.2f %8.2f %6.2f %7.2f %6.2f "
        "%7.2f %6.2f %9.2f %9.2f %6.2f %9.2f\n",
        c.geometry.name.c_str(), c.transport.c_str(), r["lane"].get<std::string>().c_str(),
        c.prompt, c.block, r["layer_bytes"].get<double>() / 1024, r["total_ms"].get<double>(),
        r["gbps"].get<double>(), r["layer_latency_p50_us"].get<double>(),
        r["layer_latency_p99_us"].get<double>(), r["perftest_gbps"].get<double>(),
        r["ratio_to_perftest"].get<double>(), r["perftest_layer_message_gbps"].get<double>(),
        r["ratio_to_perftest_layer_message"].get<double>(), r["memcpy_gbps"].get<double>(),
        r["ratio_to_memcpy"].get<double>(), r["whole_kv_copy_gbps"].get<double>(),
        r["ratio_to_whole_kv_copy"].get<double>(), r["pipelined_tail_ms"].get<double>(),
        r["bulk_after_tail_ms"].get<double>(), r["pipelined_tail_in_layers"].get<double>(),
        r["pipelined_tail_hook_at_layer_end_in_layers"].get<double>());
    std::fflush(stdout);
    rows.push_back(r);
  }
  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    std::ofstream out(path);
    out << json{{"bench", "transfer_bench"}, {"quick", quick}, {"rows", rows}}.dump(2) << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace duet::transfer

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_role) == "receiver") return duet::transfer::RunReceiver();
  return duet::transfer::RunSweep();
}
