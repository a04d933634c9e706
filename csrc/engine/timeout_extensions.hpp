// torch's ephemeral timeout extensions (Backend::addEphemeralTimeout, which
// torch.compile uses while ranks compile at different speeds): an extension
// adds to the timeout of every operation issued after it, until the first of
// those operations completes. Extensions accumulate; each expires with its own
// first operation. Operations issued before an extension keep their timeout.
// Thread-safe: the caller's thread issues, the progress thread completes.
#pragma once
#include <chrono>
#include <memory>
#include <mutex>

namespace roce::engine {

class TimeoutExtensions {
  struct State {
    std::mutex mu;
    std::chrono::milliseconds active{0};    // the sum of the unexpired extensions
    std::chrono::milliseconds inFlight{0};  // of which some operation already owns the expiry
  };

 public:
  // Held by an operation: the extensions it is the first one after. Released
  // when the operation completes (release(), or destruction if it never ran).
  class Claim {
   public:
    Claim() = default;
    Claim(const Claim&) = delete;
    Claim& operator=(const Claim&) = delete;
    ~Claim() { release(); }
    void release();

   private:
    friend class TimeoutExtensions;
    std::shared_ptr<State> state_;
    std::chrono::milliseconds owned_{0};
  };

  // Throws std::invalid_argument for a negative extension.
  void add(std::chrono::milliseconds extra);
  // For an operation issued now: what to add to its timeout; `claim` then owns
  // the expiry of the extensions no earlier operation owns.
  std::chrono::milliseconds issue(Claim& claim);
  std::chrono::milliseconds active() const;

 private:
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

}  // namespace roce::engine
