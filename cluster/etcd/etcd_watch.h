// WatchHandle: one watch on etcd's JSON gateway (POST /v3/watch, a streaming HTTP response of
// one JSON message per line), made by EtcdClient::Watch (docs/design.md §4.8). Its own thread
// reads the stream incrementally and calls the callback with each event, in revision order. A
// watch on keys that do not change reads nothing for as long as they do not, so the thread also
// probes the member serving it every `probe_interval` (a one-key read on a connection of its own
// that must answer within `probe_timeout`): a hung or cut-off etcd fails the watch rather than
// being waited on. (The gateway of etcd 3.4 cannot take progress requests on the watch's own
// request stream: its HTTP/1 server holds the response back until the request body has ended.)
// Destroying the handle cancels the watch and joins the thread: no callback runs after the
// destructor returns (it may be destroyed from its own callback too).
//
//   auto watch = etcd.Watch("/duet/nodes/", list.revision + 1,
//       [&](absl::StatusOr<WatchEvent> event) {
//         if (!event.ok()) { /* last call: re-list, watch from last_seen + 1 */ return; }
//         last_seen = event->revision;
//       });
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cluster/etcd/etcd_types.h"

namespace duet::etcd {

class EndpointSet;  // etcd_http.h
class WatchStream;  // etcd_watch.cc

struct WatchOptions {
  // How often the member serving the watch is probed.
  absl::Duration probe_interval = absl::Seconds(1);
  // A probe unanswered for this long fails the watch (DeadlineExceeded); a refused or broken
  // one at once (Unavailable). A hung member is noticed within probe_interval + probe_timeout.
  absl::Duration probe_timeout = absl::Seconds(2);
  // The largest single message accepted (one batch of events).
  size_t max_message_bytes = size_t{64} << 20;
};

// Each event once, in order; a non-OK status is the last call (the watch has ended). Runs on the
// watch's thread; it must not block for long (it delays the events after it).
using WatchCallback = absl::AnyInvocable<void(absl::StatusOr<WatchEvent>)>;

class WatchHandle {
 public:
  // Use EtcdClient::Watch. Watches [key, range_end) from start_revision; returns once etcd
  // answered "created", or the error (connect, HTTP, etcd's) if that did not happen by
  // `create_deadline`; `callback` then never runs.
  static absl::StatusOr<std::unique_ptr<WatchHandle>> Start(std::shared_ptr<EndpointSet> set,
                                                            std::string key, std::string range_end,
                                                            int64_t start_revision,
                                                            absl::Time create_deadline,
                                                            WatchCallback callback,
                                                            WatchOptions options);
  ~WatchHandle();
  WatchHandle(const WatchHandle&) = delete;
  WatchHandle& operator=(const WatchHandle&) = delete;

  // The member serving the watch ("http://HOST:PORT").
  const std::string& endpoint() const { return endpoint_; }

 private:
  WatchHandle(std::shared_ptr<WatchStream> stream, std::thread thread, std::string endpoint);

  std::shared_ptr<WatchStream> stream_;  // shared with the thread
  std::thread thread_;
  std::string endpoint_;
};

}  // namespace duet::etcd
