#include "cli/flag_groups.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace duet::cli {

const std::vector<FlagGroupInfo>& AllFlagGroups() {
  static const std::vector<FlagGroupInfo>* const groups = [] {
    auto* all = new std::vector<FlagGroupInfo>;
    for (const auto& of_file :
         {ModelFlagGroups, NodeFlagGroups, TransportFlagGroups, CoordinatorFlagGroups,
          HttpFlagGroups, ServeFlagGroups, GenerateFlagGroups, BenchFlagGroups, TlsFlagGroups,
          EtcdFlagGroups}) {
      for (FlagGroupInfo& g : of_file()) all->push_back(std::move(g));
    }
    std::sort(all->begin(), all->end(),
              [](const FlagGroupInfo& a, const FlagGroupInfo& b) { return a.group < b.group; });
    // FlagGroupInfoOf indexes by the enum: a group missing or listed twice is a bug here.
    for (size_t i = 0; i < all->size(); ++i) {
      if (static_cast<size_t>((*all)[i].group) != i) {
        std::fprintf(stderr, "duet: flag group %zu is missing or listed twice\n", i);
        std::abort();
      }
    }
    return all;
  }();
  return *groups;
}

const FlagGroupInfo& FlagGroupInfoOf(FlagGroup group) {
  return AllFlagGroups()[static_cast<size_t>(group)];
}

std::optional<FlagGroup> GroupOfFlag(absl::string_view name) {
  for (const FlagGroupInfo& g : AllFlagGroups()) {
    for (const absl::CommandLineFlag* f : g.flags) {
      if (f->Name() == name) return g.group;
    }
  }
  return std::nullopt;
}

std::string DashedFlagName(absl::string_view name) {
  std::string dashed(name);
  std::replace(dashed.begin(), dashed.end(), '_', '-');
  return dashed;
}

}  // namespace duet::cli
