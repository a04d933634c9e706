// Something with a name for error messages ("allreduce #12 (8 bytes)"),
// formatted only when a message needs it: the small-op path formats nothing.
#pragma once
#include <string>

namespace roce {

class Describable {
 public:
  virtual ~Describable() = default;
  virtual std::string describe() const = 0;
};

}  // namespace roce
