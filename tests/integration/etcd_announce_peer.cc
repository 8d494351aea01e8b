// etcd_announce_peer: a node process for the membership-on-etcd tests, which SIGKILL it to
// model a crashed node. Announces a decode node with EtcdNodeAnnouncer, prints "announced
// <epoch>" (and "epoch <n>" after each re-announce as a new incarnation), then runs until killed.
//
//   etcd_announce_peer http://127.0.0.1:2379 /duet decode-0 3   # endpoint prefix node-id ttl-s
#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cluster/etcd/node_announcer.h"

int main(int argc, char** argv) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlives the test
  int ttl_s = 0;
  if (argc != 5 || !absl::SimpleAtoi(argv[4], &ttl_s)) {
    std::fprintf(stderr, "usage: %s ENDPOINT PREFIX NODE_ID TTL_SECONDS\n", argv[0]);
    return 2;
  }
  absl::StatusOr<duet::etcd::EtcdClient> etcd =
      duet::etcd::EtcdClient::Create({.endpoints = {argv[1]}, .call_deadline = absl::Seconds(2)});
  if (!etcd.ok()) {
    std::fprintf(stderr, "%s\n", etcd.status().ToString().c_str());
    return 1;
  }
  duet::v1::RegisterRequest registration;
  registration.mutable_node()->set_node_id(argv[3]);
  registration.set_kind(duet::v1::NODE_KIND_DECODE);
  registration.set_address(absl::StrCat("127.0.0.1:", getpid()));
  registration.mutable_capacity()->set_total_blocks(64);
  registration.mutable_compute()->set_backend("cpu");
  absl::StatusOr<std::unique_ptr<duet::etcd::EtcdNodeAnnouncer>> announcer =
      duet::etcd::EtcdNodeAnnouncer::Start(
          *etcd, {.prefix = argv[2],
                  .registration = registration,
                  .lease_ttl = absl::Seconds(ttl_s),
                  .on_new_epoch = [](uint64_t epoch) {
                    std::printf("epoch %llu\n", static_cast<unsigned long long>(epoch));
                    std::fflush(stdout);
                  }});
  if (!announcer.ok()) {
    std::fprintf(stderr, "%s\n", announcer.status().ToString().c_str());
    return 1;
  }
  std::printf("announced %llu\n", static_cast<unsigned long long>((*announcer)->epoch()));
  std::fflush(stdout);
  while (true) absl::SleepFor(absl::Seconds(60));
}
