#include "timeout_extensions.hpp"

#include <stdexcept>
#include <string>

namespace roce::engine {

void TimeoutExtensions::Claim::release() {
  if (!state_) return;
  std::lock_guard<std::mutex> g(state_->mu);
  state_->active -= owned_;
  state_->inFlight -= owned_;
  state_.reset();
  owned_ = std::chrono::milliseconds(0);
}

void TimeoutExtensions::add(std::chrono::milliseconds extra) {
  if (extra.count() < 0)
    throw std::invalid_argument("roce: an ephemeral timeout extension must not be negative, got " +
                                std::to_string(extra.count()) + " ms");
  std::lock_guard<std::mutex> g(state_->mu);
  state_->active += extra;
}

std::chrono::milliseconds TimeoutExtensions::issue(Claim& claim) {
  claim.release();
  std::lock_guard<std::mutex> g(state_->mu);
  const auto unowned = state_->active - state_->inFlight;
  if (unowned.count() > 0) {
    claim.state_ = state_;
    claim.owned_ = unowned;
    state_->inFlight = state_->active;
  }
  return state_->active;
}

std::chrono::milliseconds TimeoutExtensions::active() const {
  std::lock_guard<std::mutex> g(state_->mu);
  return state_->active;
}

}  // namespace roce::engine
