// FreeLoopbackPort: a TCP port on 127.0.0.1 that the kernel just handed out and that is free
// again, for a test to give a server it starts (free unless someone takes it in between: retry
// with another when the server cannot bind it).
//
//   const int port = FreeLoopbackPort();   // 0 if none could be had
#pragma once

namespace duet::testing {

int FreeLoopbackPort();

}  // namespace duet::testing
