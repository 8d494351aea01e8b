// Minimal leveled logging to stderr and fatal checks (the Debian Abseil has no absl/log).
//
//   DUET_LOG(INFO) << "listening on " << addr;
//   DUET_CHECK(ptr != nullptr) << "pool not created";
//   duet::SetMinLogLevel(duet::LogLevel::kWarning);  // quieter tests and benches
#pragma once

#include <sstream>
#include <string_view>

namespace duet {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kFatal = 4 };

void SetMinLogLevel(LogLevel level);
LogLevel MinLogLevel();

namespace internal {

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

// Swallows the stream when a level is disabled.
struct LogVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace internal
}  // namespace duet

#define DUET_LOG_LEVEL_DEBUG ::duet::LogLevel::kDebug
#define DUET_LOG_LEVEL_INFO ::duet::LogLevel::kInfo
#define DUET_LOG_LEVEL_WARNING ::duet::LogLevel::kWarning
#define DUET_LOG_LEVEL_ERROR ::duet::LogLevel::kError
#define DUET_LOG_LEVEL_FATAL ::duet::LogLevel::kFatal

#define DUET_LOG(level)                                             \
  (DUET_LOG_LEVEL_##level < ::duet::MinLogLevel())                  \
      ? (void)0                                                     \
      : ::duet::internal::LogVoidify() &                            \
            ::duet::internal::LogMessage(DUET_LOG_LEVEL_##level, __FILE__, __LINE__).stream()

#define DUET_CHECK(cond)                                                                \
  (cond) ? (void)0                                                                      \
         : ::duet::internal::LogVoidify() &                                             \
               ::duet::internal::LogMessage(::duet::LogLevel::kFatal, __FILE__, __LINE__) \
                       .stream()                                                        \
                   << "Check failed: " #cond " "
