// Checks on roce's own error type (csrc/common/error.hpp), on top of check.hpp:
// an error path is right when it throws roce::Error of the kind the adapter
// maps to the Python exception users see, and its message names the cause.
#pragma once
#include <cstring>
#include <string>

#include "check.hpp"
#include "common/error.hpp"

namespace unit {

inline const char* kindName(roce::ErrorKind k) {
  switch (k) {
    case roce::ErrorKind::Invalid: return "Invalid";
    case roce::ErrorKind::Timeout: return "Timeout";
    case roce::ErrorKind::Comm: return "Comm";
    case roce::ErrorKind::Aborted: return "Aborted";
  }
  return "?";
}

template <class Fn>
bool checkError(const char* file, int line, const char* expr, roce::ErrorKind kind, const char* text, Fn&& fn) {
  const std::string head = cat("CHECK_ERROR(", kindName(kind), ", ", expr, ")");
  try {
    fn();
  } catch (const roce::Error& e) {
    if (e.kind() != kind) {
      fail(file, line, cat(head, ": threw a ", kindName(e.kind()), " error: ", e.what()));
      return false;
    }
    if (!std::strstr(e.what(), text)) {
      fail(file, line, cat(head, ": the message does not contain \"", text, "\": ", e.what()));
      return false;
    }
    return true;
  } catch (const std::exception& e) {
    fail(file, line, cat(head, ": threw ", typeName(typeid(e)), " instead: ", e.what()));
    return false;
  }
  fail(file, line, cat(head, ": nothing was thrown"));
  return false;
}

}  // namespace unit

// expr must throw roce::Error of ErrorKind::kind whose message contains text.
#define CHECK_ERROR(kind, expr, text) \
  ::unit::checkError(__FILE__, __LINE__, #expr, ::roce::ErrorKind::kind, (text), [&] { (void)(expr); })
