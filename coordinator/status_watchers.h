// StatusWatchers: the coordinator's end of the nodes' status streams (NodeStatusStream.Watch,
// proto/duet/v1/status.proto). One stream per registered node incarnation, each read on a
// thread of its own; every message goes to `on_update` (the coordinator applies the load to its
// NodeRegistry and the cache events to its PrefixIndex). A stream that breaks (an error, the
// node's end, a message that does not apply, or silence longer than silence_timeout, which the
// coordinator's timer checks with CheckSilence) is reported to `on_break` at once and opened
// again after a backoff (initial_backoff, doubling up to max_backoff) until Forget or Watch for
// a newer incarnation of the node.
//
//   StatusWatchers watchers({}, {.on_update = [&](const NodeIncarnation& n,
//                                                 const v1::StatusUpdate& u) { ... },
//                                .on_break = [&](const NodeIncarnation& n,
//                                                const absl::Status& why) { ... }});
//   watchers.Watch({"decode-0", epoch}, "127.0.0.1:7001");   // after it registered
//   watchers.CheckSilence(absl::Now());                        // on every timer tick
//   watchers.Forget({"decode-0", epoch});                      // it died, left or was replaced
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/types.h"
#include "duet/v1/status.grpc.pb.h"

namespace duet::coordinator {

struct StatusWatchOptions {
  // A stream with no message for this long is broken (nodes send one per load interval, 100 ms).
  absl::Duration silence_timeout = absl::Seconds(2);
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(1);
};

struct StatusWatchCallbacks {
  // One message of `node`'s stream, of that incarnation. An error ends the stream (reported to
  // on_break) and it is opened again: the next message is a snapshot.
  std::function<absl::Status(const NodeIncarnation& node, const v1::StatusUpdate& update)>
      on_update;
  // `node`'s stream could not be opened or broke, for `why`.
  std::function<void(const NodeIncarnation& node, const absl::Status& why)> on_break;
};

class StatusWatchers {
 public:
  StatusWatchers(StatusWatchOptions options, StatusWatchCallbacks callbacks);
  ~StatusWatchers();  // StopAll
  StatusWatchers(const StatusWatchers&) = delete;
  StatusWatchers& operator=(const StatusWatchers&) = delete;

  // Opens `node`'s stream at `address`, ending the stream of any other incarnation of its id.
  void Watch(const NodeIncarnation& node, const std::string& address);
  // Ends `node`'s stream (not that of a newer incarnation of its id).
  void Forget(const NodeIncarnation& node);
  // Breaks every open stream silent for longer than silence_timeout at `now`.
  void CheckSilence(absl::Time now);
  // When each watched node's newest message was applied (InfinitePast: none yet).
  std::vector<std::pair<NodeId, absl::Time>> LastApplied() const;
  void StopAll();

 private:
  class Watcher;

  const StatusWatchOptions options_;
  const StatusWatchCallbacks callbacks_;
  mutable absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<NodeId, std::unique_ptr<Watcher>> watchers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace duet::coordinator
