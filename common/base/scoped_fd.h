// ScopedFd: owns a file descriptor and closes it on destruction. Move-only.
//
//   ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
//   if (fd.get() < 0) return absl::InternalError(...);
#pragma once

namespace duet {

class ScopedFd {
 public:
  explicit ScopedFd(int fd = -1) noexcept : fd_(fd) {}
  ~ScopedFd();
  ScopedFd(ScopedFd&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  ScopedFd& operator=(ScopedFd&& other) noexcept;
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace duet
