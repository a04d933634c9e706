// Correctness checks of every collective, against the exact references of
// patterns.hpp. Each runs on one group and throws on the first wrong element,
// naming the group, the call and the element.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>

namespace roce {
class Bootstrap;
}
namespace roce::comm {
class Communicator;
}

namespace scale {

class Checker {
 public:
  // `group` names the group in messages (its forced algorithm, say);
  // `store` serves the barrier check.
  Checker(roce::comm::Communicator& c, roce::Bootstrap& store, std::string group, std::chrono::milliseconds timeout)
      : comm(c), store(store), group_(std::move(group)), timeout_(timeout) {}

  roce::comm::Communicator& comm;
  roce::Bootstrap& store;
  const std::string& group() const { return group_; }
  int passed() const { return passed_; }

  // One collective (see operation.hpp), named "<group>: <what>".
  void run(const std::string& what, const std::function<void()>& body);
  // got[i] == want(i) for every i < count, else throws naming the first miss.
  template <typename T, typename Want>
  void expect(const std::string& what, const T* got, size_t count, Want want) {
    for (size_t i = 0; i < count; ++i)
      if (got[i] != want(i)) {
        std::ostringstream m;
        m << group_ << ": " << what << ": element " << i << " of " << count << " is " << +got[i] << ", expected "
          << +want(i);
        throw std::runtime_error(m.str());
      }
    ++passed_;
  }

 private:
  std::string group_;
  std::chrono::milliseconds timeout_;
  int passed_ = 0;
};

// allreduce SUM and MAX of int64 at counts on both sides of every algorithm's
// thresholds, fewer elements than ranks included.
void checkAllreduce(Checker& k);
// allgather and reduce_scatter (SUM) at sizes on both sides of their thresholds.
void checkAllgatherAndReduceScatter(Checker& k);
// Everything whose peers stay few as the group grows (docs/ALGORITHMS.md,
// "Peers per algorithm"): the two above, a small reduce and broadcasts from
// several roots, barrier.
void checkFewPeerCollectives(Checker& k);
// A large reduce, gather, scatter (several roots) and alltoallv with uneven
// sizes: the root, or every rank, talks to all the others.
void checkAllPeerCollectives(Checker& k);

}  // namespace scale
