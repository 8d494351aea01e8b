#include "coordinator/cache_directory.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace duet::coordinator {

const char* KvStateName(KvState state) {
  switch (state) {
    case KvState::kAbsent:
      return "ABSENT";
    case KvState::kReserved:
      return "RESERVED";
    case KvState::kWriting:
      return "WRITING";
    case KvState::kOwned:
      return "OWNED";
    case KvState::kReleased:
      return "RELEASED";
  }
  return "?";
}

namespace {

absl::Status Illegal(const RequestId& request, KvState from, KvState to,
                     const std::string& detail) {
  return absl::FailedPreconditionError(absl::StrCat(
      "request ", request, ": illegal KV transition ", KvStateName(from), " -> ", KvStateName(to),
      " (", detail, from == KvState::kAbsent ? "; never reserved, or already released)" : ")"));
}

}  // namespace

void CacheDirectory::AddUsage(NodeUsage& usage, KvState state, int64_t blocks, int sign) {
  switch (state) {
    case KvState::kReserved:
      usage.reserved_blocks += sign * blocks;
      break;
    case KvState::kWriting:
      usage.writing_blocks += sign * blocks;
      break;
    case KvState::kOwned:
      usage.owned_blocks += sign * blocks;
      break;
    default:
      break;
  }
}

absl::Status CacheDirectory::Reserve(const RequestId& request, const NodeIncarnation& decode,
                                     std::vector<kv::BlockId> block_ids) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(request);
  if (it != entries_.end()) {
    return Illegal(request, it->second.state, KvState::kReserved,
                   absl::StrCat("Reserve on ", decode.ToString(), "; it is held on ",
                                it->second.decode.ToString()));
  }
  if (block_ids.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", request, ": Reserve on ", decode.ToString(), " with no blocks"));
  }
  absl::flat_hash_set<kv::BlockId> seen;
  for (kv::BlockId b : block_ids) {
    if (!seen.insert(b).second) {
      return absl::InvalidArgumentError(absl::StrCat("request ", request, ": Reserve on ",
                                                     decode.ToString(), " repeats block ", b));
    }
  }
  auto node_it = nodes_.find(decode);
  if (node_it != nodes_.end()) {
    for (kv::BlockId b : block_ids) {
      auto held = node_it->second.blocks.find(b);
      if (held != node_it->second.blocks.end()) {
        return absl::AlreadyExistsError(absl::StrCat("request ", request, ": block ", b, " on ",
                                                     decode.ToString(),
                                                     " is already held by request ", held->second));
      }
    }
  }
  NodeTable& table = nodes_[decode];
  for (kv::BlockId b : block_ids) table.blocks[b] = request;
  table.requests.insert(request);
  table.usage.requests += 1;
  AddUsage(table.usage, KvState::kReserved, static_cast<int64_t>(block_ids.size()), +1);
  KvEntry entry;
  entry.request_id = request;
  entry.state = KvState::kReserved;
  entry.decode = decode;
  entry.block_ids = std::move(block_ids);
  entries_.emplace(request, std::move(entry));
  return absl::OkStatus();
}

absl::Status CacheDirectory::BeginWrite(const RequestId& request, const NodeIncarnation& prefill) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(request);
  const std::string detail = absl::StrCat("BeginWrite by ", prefill.ToString());
  if (it == entries_.end()) return Illegal(request, KvState::kAbsent, KvState::kWriting, detail);
  KvEntry& e = it->second;
  if (e.state != KvState::kReserved) return Illegal(request, e.state, KvState::kWriting, detail);
  NodeTable& table = nodes_[e.decode];
  const int64_t n = static_cast<int64_t>(e.block_ids.size());
  AddUsage(table.usage, KvState::kReserved, n, -1);
  AddUsage(table.usage, KvState::kWriting, n, +1);
  e.state = KvState::kWriting;
  e.writer = prefill;
  writers_[prefill].insert(request);
  return absl::OkStatus();
}

absl::Status CacheDirectory::CompleteWrite(const RequestId& request) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(request);
  if (it == entries_.end()) {
    return Illegal(request, KvState::kAbsent, KvState::kOwned, "CompleteWrite");
  }
  KvEntry& e = it->second;
  if (e.state != KvState::kWriting) {
    return Illegal(request, e.state, KvState::kOwned,
                   absl::StrCat("CompleteWrite on ", e.decode.ToString()));
  }
  NodeTable& table = nodes_[e.decode];
  const int64_t n = static_cast<int64_t>(e.block_ids.size());
  AddUsage(table.usage, KvState::kWriting, n, -1);
  AddUsage(table.usage, KvState::kOwned, n, +1);
  e.state = KvState::kOwned;
  auto w = writers_.find(*e.writer);
  if (w != writers_.end()) {
    w->second.erase(request);
    if (w->second.empty()) writers_.erase(w);
  }
  return absl::OkStatus();
}

void CacheDirectory::RemoveLocked(const KvEntry& e) {
  auto node_it = nodes_.find(e.decode);
  if (node_it != nodes_.end()) {
    NodeTable& table = node_it->second;
    for (kv::BlockId b : e.block_ids) table.blocks.erase(b);
    table.requests.erase(e.request_id);
    table.usage.requests -= 1;
    AddUsage(table.usage, e.state, static_cast<int64_t>(e.block_ids.size()), -1);
    if (table.requests.empty()) nodes_.erase(node_it);
  }
  if (e.state == KvState::kWriting && e.writer) {
    auto w = writers_.find(*e.writer);
    if (w != writers_.end()) {
      w->second.erase(e.request_id);
      if (w->second.empty()) writers_.erase(w);
    }
  }
}

absl::StatusOr<KvEntry> CacheDirectory::Release(const RequestId& request) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(request);
  if (it == entries_.end()) {
    return Illegal(request, KvState::kAbsent, KvState::kReleased, "Release");
  }
  KvEntry entry = std::move(it->second);
  entries_.erase(it);
  RemoveLocked(entry);
  return entry;
}

std::vector<AffectedRequest> CacheDirectory::DropNode(const NodeIncarnation& node) {
  std::vector<AffectedRequest> affected;
  absl::MutexLock lock(&mu_);
  auto node_it = nodes_.find(node);
  if (node_it != nodes_.end()) {
    const std::vector<RequestId> held(node_it->second.requests.begin(),
                                      node_it->second.requests.end());
    for (const RequestId& r : held) {
      auto it = entries_.find(r);
      if (it == entries_.end()) continue;
      KvEntry entry = std::move(it->second);
      entries_.erase(it);
      affected.push_back(
          {entry.request_id, AffectedRequest::Role::kHolder, entry.state, entry.decode});
      RemoveLocked(entry);
    }
    nodes_.erase(node);  // normally already gone with its last request
  }
  auto w = writers_.find(node);
  if (w != writers_.end()) {
    for (const RequestId& r : w->second) {
      const KvEntry& e = entries_.at(r);
      affected.push_back({r, AffectedRequest::Role::kWriter, e.state, e.decode});
    }
  }
  return affected;
}

std::optional<KvEntry> CacheDirectory::Find(const RequestId& request) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(request);
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

KvState CacheDirectory::StateOf(const RequestId& request) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(request);
  return it == entries_.end() ? KvState::kAbsent : it->second.state;
}

NodeUsage CacheDirectory::Usage(const NodeIncarnation& node) const {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node);
  return it == nodes_.end() ? NodeUsage{} : it->second.usage;
}

std::vector<std::pair<NodeIncarnation, NodeUsage>> CacheDirectory::AllUsage() const {
  std::vector<std::pair<NodeIncarnation, NodeUsage>> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [node, table] : nodes_) out.emplace_back(node, table.usage);
  return out;
}

std::optional<RequestId> CacheDirectory::HolderOf(const NodeIncarnation& node,
                                                  kv::BlockId block) const {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node);
  if (it == nodes_.end()) return std::nullopt;
  auto b = it->second.blocks.find(block);
  if (b == it->second.blocks.end()) return std::nullopt;
  return b->second;
}

size_t CacheDirectory::size() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

absl::Status CacheDirectory::CheckConsistency() const {
  absl::MutexLock lock(&mu_);
  absl::btree_map<NodeIncarnation, NodeUsage> expected;
  size_t writing = 0;
  for (const auto& [id, e] : entries_) {
    if (e.state != KvState::kReserved && e.state != KvState::kWriting &&
        e.state != KvState::kOwned) {
      return absl::InternalError(
          absl::StrCat("request ", id, " stored in state ", KvStateName(e.state)));
    }
    auto node_it = nodes_.find(e.decode);
    if (node_it == nodes_.end() || !node_it->second.requests.contains(id)) {
      return absl::InternalError(
          absl::StrCat("request ", id, " missing from the table of ", e.decode.ToString()));
    }
    for (kv::BlockId b : e.block_ids) {
      auto held = node_it->second.blocks.find(b);
      if (held == node_it->second.blocks.end() || held->second != id) {
        return absl::InternalError(absl::StrCat("block ", b, " of request ", id, " on ",
                                                e.decode.ToString(), " not indexed to it"));
      }
    }
    NodeUsage& u = expected[e.decode];
    u.requests += 1;
    const int64_t n = static_cast<int64_t>(e.block_ids.size());
    if (e.state == KvState::kReserved) u.reserved_blocks += n;
    if (e.state == KvState::kWriting) u.writing_blocks += n;
    if (e.state == KvState::kOwned) u.owned_blocks += n;
    if (e.state == KvState::kWriting) {
      ++writing;
      auto w = e.writer ? writers_.find(*e.writer) : writers_.end();
      if (w == writers_.end() || !w->second.contains(id)) {
        return absl::InternalError(absl::StrCat("WRITING request ", id, " not indexed by writer"));
      }
    }
  }
  size_t indexed_writing = 0;
  for (const auto& [node, reqs] : writers_) indexed_writing += reqs.size();
  if (indexed_writing != writing) {
    return absl::InternalError(
        absl::StrCat(indexed_writing, " writer index entries for ", writing, " WRITING requests"));
  }
  if (expected.size() != nodes_.size()) {
    return absl::InternalError(absl::StrCat(nodes_.size(), " node tables for ", expected.size(),
                                            " nodes holding requests"));
  }
  for (const auto& [node, table] : nodes_) {
    auto e = expected.find(node);
    if (e == expected.end() || !(e->second == table.usage)) {
      return absl::InternalError(
          absl::StrCat("usage counters of ", node.ToString(), " disagree with its entries"));
    }
    size_t blocks = 0;
    for (const RequestId& r : table.requests) blocks += entries_.at(r).block_ids.size();
    if (blocks != table.blocks.size()) {
      return absl::InternalError(absl::StrCat(node.ToString(), " indexes ", table.blocks.size(),
                                              " blocks, its requests hold ", blocks));
    }
  }
  return absl::OkStatus();
}

}  // namespace duet::coordinator
