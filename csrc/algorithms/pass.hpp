// A collective step that advances without blocking, so that several of them
// (hier's phases on different pieces, a ring's channels) share one wait:
// start(), then advance() until it returns true. Concurrent passes need
// distinct tags (or distinct peers) and distinct scratch indices.
#pragma once
#include <vector>

namespace roce::comm {
class Communicator;
}
namespace roce::transport {
struct Request;
}
namespace roce::algorithms {
using namespace roce::transport;
using namespace roce::comm;


class Pass {
 public:
  virtual ~Pass() = default;
  // Posts the first requests (advance() starts a pass that was not started).
  virtual void start() = 0;
  // Handles whatever has landed; true once every request has finished.
  // Throws on a failed request.
  virtual bool advance() = 0;
};

// True once `r` is done; throws (with the communicator's context) if it failed.
bool finished(Communicator& c, const Request* r);
// The same for all of `reqs`.
bool finished(Communicator& c, const std::vector<Request*>& reqs);

}  // namespace roce::algorithms
