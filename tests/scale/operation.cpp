#include "operation.hpp"

#include <stdexcept>

#include "../../csrc/comm/communicator.hpp"

namespace scale {

void runOperation(roce::comm::Communicator& c, const std::string& what, std::chrono::milliseconds timeout,
                  const std::function<void()>& body) {
  c.beginOperation(what, roce::Clock::now() + timeout);
  try {
    body();
    // As the engine checks: a collective that returns with a request in
    // flight could still write into its buffers afterwards.
    if (c.hasPendingRequests()) throw std::runtime_error(what + " returned with requests still in flight");
  } catch (const std::exception& e) {
    c.endOperation();
    c.breakWith(e.what());
    throw;
  }
  c.endOperation();
}

}  // namespace scale
