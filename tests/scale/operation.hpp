// Runs one collective on a Communicator the way the engine does (there is no
// engine here: the rank's main thread drives the group, and the
// Communicator's progress happens inside its waits): named and with a
// deadline, so a hang ends in the core's own timeout message; a failure
// breaks the group, which tells the peers through the lifelines so they stop
// too, and is rethrown.
#pragma once
#include <chrono>
#include <functional>
#include <string>

namespace roce::comm {
class Communicator;
}

namespace scale {

void runOperation(roce::comm::Communicator& c, const std::string& what, std::chrono::milliseconds timeout,
                  const std::function<void()>& body);

}  // namespace scale
