#include "log.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace roce {

LogLevel logLevel() {
  static const LogLevel level = [] {
    const char* v = std::getenv("ROCE_PG_DEBUG");
    if (!v) return LogLevel::Warn;
    if (!strcasecmp(v, "INFO")) return LogLevel::Info;
    if (!strcasecmp(v, "TRACE")) return LogLevel::Trace;
    return LogLevel::Warn;
  }();
  return level;
}

void logLine(LogLevel level, const std::string& msg) {
  static const char* names[] = {"WARN", "INFO", "TRACE"};
  // One fprintf per line keeps lines from different ranks whole.
  std::fprintf(stderr, "[roce pid %d %s] %s\n", static_cast<int>(getpid()),
               names[static_cast<int>(level)], msg.c_str());
}

}  // namespace roce
