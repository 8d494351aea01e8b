// A `duet serve ...` process (--loopback or --colocated) for integration tests: started with
// its stdout on a pipe, ready once it printed "ready ADDR", stopped with its whole process
// group when destroyed, even when a test fails.
//
//   ServeProcess s(DUET_BIN, {"--colocated", "--model=" + dir, "--threads=1"});
//   ASSERT_TRUE(s.ready());
//   auto stub = v1::Generation::NewStub(rpc::MakeChannel(s.address()));
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace duet::testing {

class ServeProcess {
 public:
  ServeProcess(const std::string& bin, const std::vector<std::string>& flags,
               absl::Duration ready_timeout = absl::Seconds(120)) {
    int fds[2];
    if (pipe(fds) != 0) return;
    std::vector<std::string> argv = {bin, "serve"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], STDOUT_FILENO);
      close(fds[0]);
      close(fds[1]);
      setpgid(0, 0);  // its own group: the test can kill the whole tree
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      execv(bin.c_str(), args.data());
      _exit(127);
    }
    close(fds[1]);
    out_ = fdopen(fds[0], "r");
    const absl::Time deadline = absl::Now() + ready_timeout;
    char line[1024];
    while (absl::Now() < deadline && std::fgets(line, sizeof(line), out_) != nullptr) {
      const std::string l(line);
      if (l.rfind("ready ", 0) == 0) {
        std::istringstream in(l.substr(6));
        in >> address_;
        break;
      }
    }
  }
  ~ServeProcess() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    const absl::Time deadline = absl::Now() + absl::Seconds(15);
    int st;
    while (waitpid(pid_, &st, WNOHANG) == 0) {
      if (absl::Now() > deadline) {
        kill(-pid_, SIGKILL);
        waitpid(pid_, &st, 0);
        break;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    if (out_) std::fclose(out_);
  }
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;

  bool ready() const { return !address_.empty(); }
  const std::string& address() const { return address_; }

 private:
  pid_t pid_ = -1;
  FILE* out_ = nullptr;
  std::string address_;
};

}  // namespace duet::testing
