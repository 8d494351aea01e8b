// The one SIGINT/SIGTERM handling of the long-running commands (coordinator, prefill, decode,
// serve): the signal sets a flag the command polls; nothing else runs in the handler.
//
//   InstallStopSignalHandlers();   // SIGPIPE ignored too (a closed client socket is an error)
//   WaitForStopSignal();           // returns once SIGINT or SIGTERM came
//   while (!StopRequested()) { ... supervise ...; if (done) RequestStop(); }
#pragma once

#include "absl/time/time.h"

namespace duet::cli {

void InstallStopSignalHandlers();
bool StopRequested();
// As if a signal came (a supervisor that has nothing left to supervise).
void RequestStop();
// Polls every `poll` until StopRequested().
void WaitForStopSignal(absl::Duration poll = absl::Milliseconds(100));

}  // namespace duet::cli
