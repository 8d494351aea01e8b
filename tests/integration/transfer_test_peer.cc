// transfer_test_peer: the sending (prefill) side of the two-process transfer tests. Reads the
// receiver's address and request plan from --dir, streams every request layer by layer with
// KvStreamSender, and writes its own address, errors and progress markers back to --dir.
//
//   transfer_test_peer --dir=/tmp/x --profile=shm --layers=4 --mode=stream --seed=7
// Modes: stream (all layers, then the final notice), slow (sleeps --layer_ms per layer; the
// test kills it mid-stream), abort (posts half the layers of even requests, then aborts them),
// receiver (the roles swapped: it only exports its pool and waits to be killed), stall (posts
// layer 0 of every request, then answers quiet requests (QuietResponder) until the receiver is
// done; the test stops and continues it; once the file `late` appears it writes request 0's
// destination blocks once more, bypassing KvStreamSender, and reports how that went in
// `send.late`).
#include <sys/prctl.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/clock.h"
#include "common/base/logging.h"
#include "common/kv/block_pool.h"
#include "tests/integration/transfer_test_util.h"
#include "transfer/kv_stream/block_ops.h"
#include "transfer/kv_stream/kv_stream_sender.h"
#include "transfer/kv_stream/quiet_responder.h"
#include "transfer/transport.h"
#include "transfer/ucx/ucx_transport.h"

namespace duet::transfer::testing {
namespace {

std::string Flag(int argc, char** argv, const std::string& name, const std::string& def) {
  const std::string prefix = "--" + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]).rfind(prefix, 0) == 0)
      return std::string(argv[i]).substr(prefix.size());
  }
  return def;
}
int IntFlag(int argc, char** argv, const std::string& name, int def) {
  int v = def;
  if (!absl::SimpleAtoi(Flag(argc, argv, name, std::to_string(def)), &v)) return def;
  return v;
}

int Fail(const std::string& dir, const absl::Status& s) {
  WriteFileAtomic(dir + "/send.err", std::string(s.message()));
  std::fprintf(stderr, "transfer_test_peer: %s\n", s.ToString().c_str());
  return 2;
}

int Run(int argc, char** argv) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
  SetMinLogLevel(LogLevel::kWarning);
  const std::string dir = Flag(argc, argv, "dir", "");
  const std::string mode = Flag(argc, argv, "mode", "stream");
  const uint64_t seed = static_cast<uint64_t>(IntFlag(argc, argv, "seed", 1));
  const int layer_ms = IntFlag(argc, argv, "layer_ms", 50);
  const absl::Time deadline = DeadlineIn(absl::Seconds(IntFlag(argc, argv, "timeout_s", 30)));
  kv::KvLayout layout{.model_id = Flag(argc, argv, "model", "test"),
                      .num_layers = IntFlag(argc, argv, "layers", 2),
                      .num_kv_heads = IntFlag(argc, argv, "heads", 2),
                      .head_dim = IntFlag(argc, argv, "dim", 64),
                      .block_size = IntFlag(argc, argv, "block", 16),
                      .dtype = kv::KvDtype::kBF16};
  const int64_t num_blocks = IntFlag(argc, argv, "blocks", 512);

  auto profile = UcxProfileByName(Flag(argc, argv, "profile", "shm"));
  if (!profile.ok()) return Fail(dir, profile.status());
  TransportOptions opt{.name = "test-sender",
                       .layout = layout,
                       .tls = profile->tls,
                       .net_devices = profile->net_devices};
  auto write_mode = ParseWriteMode(Flag(argc, argv, "write_mode", "auto"));
  if (!write_mode.ok()) return Fail(dir, write_mode.status());
  opt.write_mode = *write_mode;
  opt.am_chunk_bytes = 1 << 20;
  opt.am_eager_max_bytes = 256 << 10;  // tcp: small requests eager, 1 MiB chunks rendezvous  // the 2.5 MiB-per-layer request is chunked on both lanes
  auto t = CreateTransport("ucx", opt);
  if (!t.ok()) return Fail(dir, t.status());
  Transport& transport = **t;
  auto region = transport.AllocateRegion(layout.RegionBytes(num_blocks));
  if (!region.ok()) return Fail(dir, region.status());
  auto pool = kv::BlockPool::CreateOver(layout, num_blocks, (*region)->base(), (*region)->bytes());
  if (!pool.ok()) return Fail(dir, pool.status());
  auto addr = transport.LocalAddress();
  if (!addr.ok()) return Fail(dir, addr.status());
  if (mode != "receiver") WriteFileAtomic(dir + "/send.addr", *addr);

  if (mode == "receiver") {
    // The roles swapped: publish our address as the receiver's, connect back, wait to be killed.
    WriteFileAtomic(dir + "/recv.addr", *addr);
    auto sender_addr = WaitForFile(dir + "/send.addr.test", deadline);
    if (!sender_addr.ok()) return Fail(dir, sender_addr.status());
    auto back = transport.Connect(*sender_addr, deadline);
    if (!back.ok()) return Fail(dir, back.status());
    WriteFileAtomic(dir + "/recv.ready", "");
    while (absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
    return 0;
  }
  auto recv_addr = WaitForFile(dir + "/recv.addr", deadline);
  if (!recv_addr.ok()) return Fail(dir, recv_addr.status());
  auto peer = transport.Connect(*recv_addr, deadline);
  if (!peer.ok()) return Fail(dir, peer.status());
  auto plan_text = WaitForFile(dir + "/plan", deadline);
  if (!plan_text.ok()) return Fail(dir, plan_text.status());
  const std::vector<PlannedRequest> plan = DecodePlan(*plan_text);

  auto sender = KvStreamSender::Create(&transport, layout, num_blocks);
  if (!sender.ok()) return Fail(dir, sender.status());
  // Local blocks: allocated, then shuffled, so local runs rarely line up with remote runs.
  std::mt19937_64 rng(seed);
  std::vector<std::vector<kv::BlockId>> local(plan.size());
  std::vector<uint64_t> ids;
  for (size_t r = 0; r < plan.size(); ++r) {
    auto blocks = (*pool)->Allocate(static_cast<int64_t>(plan[r].remote_blocks.size()));
    if (!blocks.ok()) return Fail(dir, blocks.status());
    local[r] = *blocks;
    if (r % 3 == 1) std::shuffle(local[r].begin(), local[r].end(), rng);
    if (absl::Status s = (*sender)->Begin({plan[r].id, *peer, local[r], plan[r].remote_blocks});
        !s.ok()) {
      return Fail(dir, s);
    }
    ids.push_back(plan[r].id);
  }
  const size_t bb = layout.BlockBytes();
  if (mode == "stall") {
    QuietResponder responder(&transport, sender->get());
    std::vector<uint64_t> all;
    for (size_t r = 0; r < plan.size(); ++r) {
      for (size_t i = 0; i < local[r].size(); ++i) {
        FillBlock((*pool)->BlockAddress(0, local[r][i]), bb, seed, plan[r].id, 0, i);
      }
      all.push_back(plan[r].id);
    }
    if (absl::Status s = (*sender)->OnLayerDone(0, all); !s.ok()) return Fail(dir, s);
    WriteFileAtomic(dir + "/send.layer0", "");
    if (!WaitForFile(dir + "/late", deadline).ok())
      return Fail(dir, absl::DeadlineExceededError("no late"));
    std::string late = "no write";
    for (int l = 0; l < layout.num_layers; ++l) {
      for (kv::BlockId b : local[0]) std::memset((*pool)->BlockAddress(l, b), 0xAB, bb);
      auto ops = LayerWriteOps(layout, num_blocks, num_blocks, l, local[0], plan[0].remote_blocks);
      if (!ops.ok()) return Fail(dir, ops.status());
      auto h = transport.PostWrite(*peer, *ops, std::nullopt);
      late = h.ok() ? h->Wait(DeadlineIn(absl::Seconds(5))).ToString() : h.status().ToString();
    }
    WriteFileAtomic(dir + "/send.late", late);
    auto done = WaitForFile(dir + "/recv.done", deadline);
    return done.ok() ? 0 : Fail(dir, done.status());
  }
  if (mode == "abort") {
    // Handle-level cancel: one large write into blocks that no request uses, cancelled at
    // once; it must end (cancelled, or done if it was faster) well before the deadline, leave
    // the endpoint usable for the stream below, and leave no receive record behind (its notice
    // is never delivered; the receiver checks the transport's pending arrivals).
    const uint64_t span = layout.BlockOffset(0, num_blocks / 2, num_blocks);
    auto h = transport.PostWrite(*peer, {{span, span, layout.RegionBytes(num_blocks) - span}},
                                 std::string("cancelled-write"));
    if (!h.ok()) return Fail(dir, h.status());
    absl::SleepFor(absl::Milliseconds(2));  // let some chunks go out first
    h->Cancel();
    absl::Status s = h->Wait(DeadlineIn(absl::Seconds(10)));
    if (!s.ok() && !absl::IsCancelled(s)) return Fail(dir, s);
    WriteFileAtomic(dir + "/send.cancel", TransferStateName(h->Poll()));
  }
  for (int l = 0; l < layout.num_layers; ++l) {
    std::vector<uint64_t> now;
    for (size_t r = 0; r < plan.size(); ++r) {
      if (mode == "abort" && r % 2 == 0 && l >= layout.num_layers / 2) continue;
      for (size_t i = 0; i < local[r].size(); ++i) {
        FillBlock((*pool)->BlockAddress(l, local[r][i]), bb, seed, plan[r].id, l, i);
      }
      now.push_back(plan[r].id);
    }
    if (absl::Status s = (*sender)->OnLayerDone(l, now); !s.ok()) return Fail(dir, s);
    if (l == 0) WriteFileAtomic(dir + "/send.layer0", "");
    if (mode == "slow") absl::SleepFor(absl::Milliseconds(layer_ms));
  }
  for (size_t r = 0; r < plan.size(); ++r) {
    absl::Status s;
    if (mode == "abort" && r % 2 == 0) {
      s = (*sender)->Abort(plan[r].id, deadline, "test abort");
    } else {
      s = (*sender)->Finish(plan[r].id, absl::StrCat("first-token:", plan[r].id));
    }
    if (!s.ok()) return Fail(dir, s);
  }
  for (size_t r = 0; r < plan.size(); ++r) {
    if (mode == "abort" && r % 2 == 0) continue;
    if (absl::Status s = (*sender)->Wait(plan[r].id, deadline); !s.ok()) return Fail(dir, s);
  }
  WriteFileAtomic(dir + "/send.done", (*t)->GetPeerInfo(*peer)->lane);
  // Stay up until the receiver has everything (so it sees our notices, not our exit).
  auto done = WaitForFile(dir + "/recv.done", deadline);
  return done.ok() ? 0 : Fail(dir, done.status());
}

}  // namespace
}  // namespace duet::transfer::testing

int main(int argc, char** argv) { return duet::transfer::testing::Run(argc, argv); }
