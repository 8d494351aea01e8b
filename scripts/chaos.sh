#!/usr/bin/env bash
# The chaos suite: every pressure and fault scenario duet is tested against, run from one place
# on a built tree (loopback processes; network namespaces where the machine allows them). Each
# scenario is an integration test that checks that every request ends within its deadline, that
# no request a live node could serve is lost (and its tokens equal one process's), and that every
# block on every surviving node is free again. CI runs the same tests as part of the suite.
#   scripts/chaos.sh [ctest args...]        e.g. scripts/chaos.sh --repeat until-fail:3
#
# Scenario                                                     Test
#   decode pool full mid-stream: preempt, resume elsewhere       ClusterFailureTest.FullDecodePoolPreemptsAndResumesTokenExact
#   request that can never fit: 400 naming max_model_len          ClusterFailureTest.RequestThatCanNeverFitIsRefusedNamingMaxModelLen
#   prefill/decode pools full: requests wait for room             ClusterFailureTest.PromptsBeyondThePoolsWaitForRoomAndFinish
#   kill -9 a decode node mid-stream: its requests continue       ClusterFailureTest.KilledDecodeNodesRequestsContinueElsewhereTokenExact
#   kill -9 a decode node before a burst: Reserve re-routed       ClusterFailureTest.ReserveOnADeadDecodeNodeIsReRouted
#   SIGSTOP a decode node: Reserve times out, re-routed           ClusterFailureTest.ReserveOnAHungDecodeNodeTimesOutAndIsReRouted
#   SIGSTOP a prefill node: retried without waiting for it        ClusterFailureTest.HungPrefillNodeIsRetriedWithoutWaitingForTheAbandonedCall
#   kill -9 a prefill node: retried elsewhere                     ClusterFailureTest.KilledPrefillNodeIsRetriedElsewhere
#   soak at saturation, a node killed and one paused              ClusterFailureTest.SoakAtSaturationWithAKilledAndAPausedNodeLosesNothing
#   a sender that never confirms: quarantine bound, fence         QuarantineTwoProcess*, *Quarantine*
#   coordinator paused (SIGSTOP) / restarted                      MembershipLivenessTest.*
#   1,000 streams + 200 slow clients, /health answering           HttpFrontLoadTest.*
#   client disconnects (streamed or not) cancel the request       *Disconnect*, *ClientLeaves*
#   a multi-host cluster in network namespaces (tcp)              netns_cluster_test
#   the P<->D link black-holed past the bound, then back          netns_blackhole_test
#   a prefill node stopped past the bound: fenced, then lifted    *FenceLifts*, *KilledByAFence*
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${DUET_BUILD_DIR:-$ROOT/build}"
[ -f "$BUILD/build.ninja" ] || { echo "chaos.sh: build first (scripts/build.sh)" >&2; exit 2; }
PATTERN='ClusterFailureTest\.|Quarantine|MembershipLivenessTest\.|HttpFrontLoadTest\.'
PATTERN+='|Disconnect|ClientLeaves|netns_cluster_test|netns_blackhole_test'
cd "$BUILD"
exec ctest -R "$PATTERN" --output-on-failure "$@"
