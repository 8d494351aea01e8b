#include "tests/integration/child_process.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace duet::testing {

ChildProcess::ChildProcess(std::vector<std::string> argv, ChildProcessOptions options) {
  int fds[2];
  if (argv.empty() || pipe(fds) != 0) return;
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);  // its own group: the test can kill the whole tree
    dup2(fds[1], STDOUT_FILENO);
    if (options.merge_stderr) dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> args;
    for (std::string& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    return;
  }
  setpgid(pid, pid);  // also from here, so the group exists before the destructor may signal it
  group_ = pid;
  out_fd_ = fds[0];
}

ChildProcess::~ChildProcess() {
  if (group_ > 0) {
    if (!reaped_) {
      kill(group_, SIGTERM);  // the child stops its own children in order
      if (Wait(absl::Seconds(15)) == -1 && !reaped_) {
        kill(-group_, SIGKILL);
        int st;
        waitpid(group_, &st, 0);
      }
    }
    kill(-group_, SIGKILL);  // anything of the group the child left behind
  }
  if (out_fd_ >= 0) close(out_fd_);
}

bool ChildProcess::Fill(absl::Time deadline) {
  if (out_fd_ < 0 || eof_) return false;
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    pollfd p{.fd = out_fd_, .events = POLLIN, .revents = 0};
    const int n = poll(&p, 1, static_cast<int>(std::min<int64_t>(
                                  absl::ToInt64Milliseconds(left) + 1, 1000)));
    if (n < 0 && errno != EINTR) return false;
    if (n <= 0) continue;
    char buf[4096];
    const ssize_t got = read(out_fd_, buf, sizeof(buf));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      eof_ = true;
      return false;
    }
    buffered_.append(buf, static_cast<size_t>(got));
    return true;
  }
}

std::optional<std::string> ChildProcess::ReadLine(absl::Time deadline) {
  size_t eol;
  while ((eol = buffered_.find('\n')) == std::string::npos) {
    if (!Fill(deadline)) {
      if (!eof_ || buffered_.empty()) return std::nullopt;
      return std::exchange(buffered_, "");  // the last line had no newline
    }
  }
  std::string line = buffered_.substr(0, eol);
  buffered_.erase(0, eol + 1);
  return line;
}

std::string ChildProcess::ReadAll(absl::Time deadline) {
  while (Fill(deadline)) {
  }
  return std::exchange(buffered_, "");
}

int ChildProcess::Wait(absl::Duration timeout) {
  if (group_ <= 0) return -1;
  if (reaped_) return exit_code_;
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int st;
    const pid_t r = waitpid(group_, &st, WNOHANG);
    if (r == group_) {
      reaped_ = true;
      exit_code_ = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
      return exit_code_;
    }
    if (r < 0 || absl::Now() >= deadline) return -1;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

std::string FindProgram(const char* env_var, const std::string& name) {
  if (const char* bin = std::getenv(env_var); bin != nullptr && *bin != '\0') return bin;
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path != nullptr ? path : "/usr/bin:/bin", ':')) {
    const std::string candidate = absl::StrCat(dir, "/", name);
    if (!dir.empty() && access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

}  // namespace duet::testing
