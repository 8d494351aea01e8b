// ChildProcess: a program started by an integration test, in its own process group with its
// stdout (and optionally its stderr) on a pipe. Destroying it stops the program (SIGTERM, then
// SIGKILL after 15 s) and kills whatever is left of its group, so a failed assertion never leaves
// servers behind. Reads take a deadline: a silent child cannot hang a test.
//
//   ChildProcess bench({DUET_BIN, "bench", "serve", "--server=" + address});
//   const std::string out = bench.ReadAll(absl::Now() + absl::Seconds(120));
//   EXPECT_EQ(bench.Wait(absl::Seconds(10)), 0) << out;
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace duet::testing {

struct ChildProcessOptions {
  bool merge_stderr = false;  // stderr on the same pipe (else it goes to the test's stderr)
};

class ChildProcess {
 public:
  // argv[0] is the program's path. started() is false when pipe or fork failed.
  explicit ChildProcess(std::vector<std::string> argv, ChildProcessOptions options = {});
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  bool started() const { return group_ > 0; }
  pid_t pid() const { return group_; }

  // The next output line without its newline; nullopt at EOF or once `deadline` passed.
  std::optional<std::string> ReadLine(absl::Time deadline);
  // The output up to EOF (the child and its descendants closed it) or `deadline`.
  std::string ReadAll(absl::Time deadline);
  // Waits for the child to exit: its exit code, or -1 if a signal ended it or it outlived
  // `timeout` (it is then stopped on destruction, as usual). Again after it exited: the same.
  int Wait(absl::Duration timeout);

 private:
  // Reads what is available into buffered_ before `deadline`; false at EOF or timeout.
  bool Fill(absl::Time deadline);

  pid_t group_ = -1;     // the child's pid, which is also its process group's id
  bool reaped_ = false;  // the child itself has exited and was waited for
  int exit_code_ = -1;   // once reaped_
  int out_fd_ = -1;
  bool eof_ = false;
  std::string buffered_;
};

// The program `name`: $`env_var` when that is set and not empty, else the first executable
// `name` on PATH; "" when there is none.
std::string FindProgram(const char* env_var, const std::string& name);

}  // namespace duet::testing
