// A rank's connection to the launcher's store (store_wire.hpp), as the
// roce::Bootstrap a Communicator forms its groups through. Blocking: one
// request, then its reply. WAIT's timeout is kept by the server, which always
// answers, so no call here needs a timeout of its own; if the launcher dies,
// the rank dies with it (PR_SET_PDEATHSIG, see rank.cpp).
#pragma once
#include <chrono>
#include <string>
#include <vector>

#include "../../csrc/common/bootstrap.hpp"
#include "../../csrc/runtime/connect.hpp"

namespace scale {

class StoreClient : public roce::Bootstrap {
 public:
  // Retries while the server's accept queue is full, up to `within`.
  StoreClient(int port, std::chrono::milliseconds within);

  void set(const std::string& key, const std::string& value) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  std::vector<std::string> multiGet(const std::vector<std::string>& keys) override;
  bool check(const std::string& key) override;
  void checkCancelled() override {}  // the harness never gives up on a forming group

 private:
  // Sends a request frame, returns the reply's body.
  std::string call(const std::string& frame);
  roce::UniqueFd fd_;
};

}  // namespace scale
