#include "cli/stop_signal.h"

#include <signal.h>

#include <atomic>

#include "absl/time/clock.h"

namespace duet::cli {
namespace {

std::atomic<bool> g_stop{false};

void OnStopSignal(int) { g_stop.store(true); }

}  // namespace

void InstallStopSignalHandlers() {
  struct sigaction sa = {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

bool StopRequested() { return g_stop.load(); }

void RequestStop() { g_stop.store(true); }

void WaitForStopSignal(absl::Duration poll) {
  while (!g_stop.load()) absl::SleepFor(poll);
}

}  // namespace duet::cli
