// The harness's key-value store (protocol: store_wire.hpp), served by the
// launcher's only thread between its other duties (reaping ranks, the wall
// clock): serveFor() handles what is ready and returns. Thousands of clients
// at once: epoll, non-blocking sockets, and a WAIT that parks its client until
// every key exists or its timeout passes, so waiting ranks cost no traffic.
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "../../csrc/runtime/connect.hpp"

namespace scale {

class StoreServer {
 public:
  using Clock = std::chrono::steady_clock;
  // `listener`: a listening TCP socket (clients may already be queued on it).
  explicit StoreServer(roce::UniqueFd listener);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  // Handles whatever is ready, blocking at most `timeout` for something to be.
  void serveFor(std::chrono::milliseconds timeout);
  // A key's value, or null: the launcher reads the ranks' reports here.
  const std::string* find(const std::string& key) const;

  // What the ranks asked of the store: group formation's load on it.
  struct Traffic {
    uint64_t requests = 0;
    uint64_t bytesIn = 0;   // request frames
    uint64_t bytesOut = 0;  // reply frames
  };
  const Traffic& traffic() const { return traffic_; }

 private:
  struct Client {
    int fd;
    std::string in;       // received bytes not yet handled
    std::string out;      // reply bytes not yet written
    uint64_t waiter = 0;  // its parked WAIT, if any: later requests queue behind it
    bool watchingOut = false;
  };
  struct Waiter {
    int fd;
    size_t missing;  // distinct keys that do not exist yet
    std::multimap<Clock::time_point, uint64_t>::iterator deadline;
  };

  void acceptAll();
  void readFrom(Client& c);
  void writeTo(Client& c);
  // Handles c's complete requests in order, stopping at a parked WAIT.
  void handleRequests(Client& c);
  void handle(Client& c, const std::string& body);
  void startWait(Client& c, const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  void finishWait(uint64_t id, bool allExist);
  void keyCreated(const std::string& key);
  void expireWaits();
  void reply(Client& c, const std::string& frame);
  void drop(int fd);

  roce::UniqueFd listener_;
  roce::UniqueFd epoll_;
  std::unordered_map<std::string, std::string> values_;
  std::unordered_map<int, std::unique_ptr<Client>> clients_;  // by descriptor
  std::unordered_map<uint64_t, Waiter> waiters_;               // by id
  // Key -> parked WAITs that need it. Ids of waits that ended meanwhile are
  // skipped (waiters_ no longer has them) and go when the key is created.
  std::unordered_map<std::string, std::vector<uint64_t>> waitingOn_;
  std::multimap<Clock::time_point, uint64_t> deadlines_;
  uint64_t nextWaiter_ = 1;
  Traffic traffic_;
  std::vector<int> doomed_;  // clients to drop once the current event batch is handled
};

}  // namespace scale
