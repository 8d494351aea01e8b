#include "coordinator/apply_status.h"

#include "absl/strings/str_cat.h"
#include "cluster/kv_events_convert.h"
#include "cluster/node_load_convert.h"
#include "common/base/status.h"

namespace duet::coordinator {

absl::Status ApplyNodeStatus(NodeRegistry& registry, PrefixIndex& index,
                             const NodeIncarnation& node, const v1::StatusUpdate& update,
                             const ApplyStatusOptions& options) {
  if (options.heartbeat) DUET_RETURN_IF_ERROR(registry.Heartbeat(node, options.now));
  if (update.has_load()) {
    DUET_RETURN_IF_ERROR(registry.ReportLoad(node, cluster::LoadFromProto(update.load())));
  }
  if (!update.has_kv_events()) return absl::OkStatus();
  const cluster::KvEvents events = cluster::KvEventsFromProto(update.kv_events());
  if (index.Apply(node, events)) {
    // The node sends a snapshot first and after every gap, so this stream is out of step: a
    // new one starts from a snapshot.
    return absl::DataLossError(absl::StrCat("status stream of ", node.ToString(),
                                            ": cache events from number ", events.first_seq,
                                            " do not continue what was applied"));
  }
  // Dropped meanwhile (declared dead, replaced): drop what was just applied.
  if (!registry.IsLive(node)) {
    index.DropNode(node);
    return absl::NotFoundError(absl::StrCat(node.ToString(), " is no longer registered"));
  }
  return absl::OkStatus();
}

}  // namespace duet::coordinator
