// Minimal leveled logging to stderr, controlled by ROCE_PG_DEBUG
// (WARN by default; INFO prints the configuration once per group; TRACE per operation).
#pragma once
#include "error.hpp"

namespace roce {

enum class LogLevel { Warn = 0, Info = 1, Trace = 2 };

LogLevel logLevel();
void logLine(LogLevel level, const std::string& msg);

#define ROCE_LOG(level, ...)                                           \
  do {                                                                 \
    if (static_cast<int>(::roce::logLevel()) >= static_cast<int>(level)) \
      ::roce::logLine(level, ::roce::str(__VA_ARGS__));                 \
  } while (0)
#define ROCE_WARN(...) ROCE_LOG(::roce::LogLevel::Warn, __VA_ARGS__)
#define ROCE_INFO(...) ROCE_LOG(::roce::LogLevel::Info, __VA_ARGS__)
#define ROCE_TRACE(...) ROCE_LOG(::roce::LogLevel::Trace, __VA_ARGS__)

}  // namespace roce
