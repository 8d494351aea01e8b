#include "coordinator/prefix_index.h"

#include <algorithm>
#include <utility>

namespace duet::coordinator {

void PrefixIndex::Store(const NodeIncarnation& node, NodeState& state, const kv::BlockHash& hash) {
  if (!state.hashes.insert(hash).second) return;
  holders_[hash].insert(node);
  ++entries_;
}

void PrefixIndex::Remove(const NodeIncarnation& node, NodeState& state, const kv::BlockHash& hash) {
  if (state.hashes.erase(hash) == 0) return;
  auto it = holders_.find(hash);
  if (it != holders_.end()) {
    it->second.erase(node);
    if (it->second.empty()) holders_.erase(it);
  }
  --entries_;
}

void PrefixIndex::Clear(const NodeIncarnation& node, NodeState& state) {
  for (const kv::BlockHash& hash : state.hashes) {
    auto it = holders_.find(hash);
    if (it == holders_.end()) continue;
    it->second.erase(node);
    if (it->second.empty()) holders_.erase(it);
  }
  entries_ -= state.hashes.size();
  state.hashes.clear();
}

bool PrefixIndex::Apply(const NodeIncarnation& node, const cluster::KvEvents& events) {
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = nodes_.try_emplace(node.node_id);
  NodeState& state = it->second;
  if (inserted) {
    state.epoch = node.epoch;
  } else if (node.epoch < state.epoch) {
    return false;  // a superseded incarnation: the registry refuses its heartbeats anyway
  } else if (node.epoch > state.epoch) {
    Clear(NodeIncarnation{node.node_id, state.epoch}, state);
    state = NodeState{.epoch = node.epoch};
  }
  if (events.snapshot) {
    Clear(node, state);
    for (const kv::KvCacheEvent& e : events.events) {
      if (e.kind == kv::KvCacheEvent::Kind::kStored) Store(node, state, e.hash);
    }
    state.synced = true;
    state.next_seq = events.first_seq;
    return false;
  }
  if (!state.synced || events.first_seq != state.next_seq) {
    state.synced = false;
    return true;
  }
  for (const kv::KvCacheEvent& e : events.events) {
    if (e.kind == kv::KvCacheEvent::Kind::kStored) {
      Store(node, state, e.hash);
    } else {
      Remove(node, state, e.hash);
    }
  }
  state.next_seq += events.events.size();
  return false;
}

void PrefixIndex::DropNode(const NodeIncarnation& node) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node.node_id);
  if (it == nodes_.end() || it->second.epoch != node.epoch) return;
  Clear(node, it->second);
  nodes_.erase(it);
}

int64_t PrefixIndex::LeadingBlocks(const NodeIncarnation& node,
                                   absl::Span<const kv::BlockHash> chain) const {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node.node_id);
  if (it == nodes_.end() || it->second.epoch != node.epoch) return 0;
  int64_t n = 0;
  while (n < static_cast<int64_t>(chain.size()) && it->second.hashes.contains(chain[n])) ++n;
  return n;
}

absl::flat_hash_map<NodeIncarnation, int64_t> PrefixIndex::LeadingBlocksAll(
    absl::Span<const kv::BlockHash> chain) const {
  absl::flat_hash_map<NodeIncarnation, int64_t> out;
  absl::MutexLock lock(&mu_);
  // Block i extends the run of every node that held blocks 0..i-1 and holds block i.
  for (size_t i = 0; i < chain.size(); ++i) {
    auto it = holders_.find(chain[i]);
    if (it == holders_.end()) break;
    int64_t extended = 0;
    for (const NodeIncarnation& node : it->second) {
      if (i == 0) {
        out[node] = 1;
        ++extended;
        continue;
      }
      auto o = out.find(node);
      if (o != out.end() && o->second == static_cast<int64_t>(i)) {
        o->second = static_cast<int64_t>(i) + 1;
        ++extended;
      }
    }
    if (extended == 0) break;
  }
  return out;
}

size_t PrefixIndex::size() const {
  absl::MutexLock lock(&mu_);
  return entries_;
}

std::vector<std::pair<NodeId, size_t>> PrefixIndex::BlocksByNode() const {
  std::vector<std::pair<NodeId, size_t>> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, state] : nodes_) out.emplace_back(id, state.hashes.size());
  std::sort(out.begin(), out.end());
  return out;
}

size_t PrefixIndex::num_hashes() const {
  absl::MutexLock lock(&mu_);
  return holders_.size();
}

bool PrefixIndex::synced(const NodeIncarnation& node) const {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node.node_id);
  return it != nodes_.end() && it->second.epoch == node.epoch && it->second.synced;
}

}  // namespace duet::coordinator
