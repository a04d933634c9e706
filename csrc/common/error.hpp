// Error types raised below the torch adapter. The adapter maps them onto
// c10::DistBackendError so Python sees torch.distributed.DistBackendError.
#pragma once
#include <stdexcept>
#include <string>

namespace roce {

enum class ErrorKind {
  Invalid,   // bad arguments; raised before any communication, group stays usable
  Timeout,   // a deadline expired while waiting on peers
  Comm,      // a peer failed, disconnected or sent something unexpected
  Aborted,   // the group was shut down or aborted while work was pending
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& msg) : std::runtime_error(msg), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// Formats its arguments with operator<< into one message.
template <typename... Args>
std::string str(const Args&... args);

}  // namespace roce

#include <sstream>
namespace roce {
template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

[[noreturn]] inline void throwInvalid(const std::string& m) { throw Error(ErrorKind::Invalid, "roce: " + m); }
[[noreturn]] inline void throwComm(const std::string& m) { throw Error(ErrorKind::Comm, "roce: " + m); }
[[noreturn]] inline void throwTimeout(const std::string& m) { throw Error(ErrorKind::Timeout, "roce: " + m); }
}  // namespace roce
