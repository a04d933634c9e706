#include "pass.hpp"

#include "../comm/communicator.hpp"

namespace roce::algorithms {
using namespace roce::comm;

bool finished(Communicator& c, const Request* r) {
  if (!r->done) return false;
  if (r->failed()) c.wait(*const_cast<Request*>(r));  // throws, naming the operation and peer
  return true;
}

bool finished(Communicator& c, const std::vector<Request*>& reqs) {
  for (const Request* r : reqs)
    if (!finished(c, r)) return false;
  return true;
}

}  // namespace roce::algorithms
