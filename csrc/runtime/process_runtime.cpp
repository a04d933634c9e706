#include "process_runtime.hpp"

#include <cstdint>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "../common/error.hpp"
#include "front_desk.hpp"
#include "process_links.hpp"

namespace roce::runtime {

ProcessRuntime& ProcessRuntime::get() {
  // One per process; a forked child builds its own (the parent's thread is
  // not there). The old one is leaked on purpose: its mutex may have been
  // held by a parent thread at the fork.
  static std::mutex mu;
  static ProcessRuntime* runtime = nullptr;
  static pid_t owner = 0;
  std::lock_guard<std::mutex> g(mu);
  if (runtime == nullptr || owner != getpid()) {
    runtime = new ProcessRuntime();
    owner = getpid();
  }
  return *runtime;
}

ProcessRuntime::ProcessRuntime() {
  pokeFd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (pokeFd_ < 0) throwComm(str("eventfd() for roce's runtime thread failed: ", std::strerror(errno)));
  desk_ = std::make_unique<FrontDesk>(*this);
  services_.push_back({desk_.get(), nextId_++});
  links_ = std::make_unique<ProcessLinks>(*this, *desk_);
  services_.push_back({links_.get(), nextId_++});
  std::thread t([this] { loop(); });
  pthread_setname_np(t.native_handle(), "roce-runtime");
  t.detach();
}

void ProcessRuntime::attach(RuntimeService* s) {
  {
    std::lock_guard<std::mutex> g(mu_);
    services_.push_back({s, nextId_++});
  }
  poke();
}

void ProcessRuntime::detach(RuntimeService* s) {
  std::lock_guard<std::mutex> g(mu_);  // not inside one of s's callbacks once we hold it
  services_.erase(std::remove_if(services_.begin(), services_.end(), [&](const Attached& a) { return a.s == s; }),
                  services_.end());
}

void ProcessRuntime::poke() {
  uint64_t one = 1;
  (void)!write(pokeFd_, &one, sizeof(one));
}

size_t ProcessRuntime::services() const {
  std::lock_guard<std::mutex> g(mu_);
  return services_.size();
}

void ProcessRuntime::loop() {
  struct Slice {
    Attached a;
    size_t begin, end;
  };
  std::vector<pollfd> fds;
  std::vector<Slice> slices;
  for (;;) {
    fds.assign(1, pollfd{pokeFd_, POLLIN, 0});
    slices.clear();
    auto until = Clock::now() + std::chrono::seconds(1);
    {
      std::lock_guard<std::mutex> g(mu_);
      const auto now = Clock::now();
      for (const Attached& a : services_) {
        until = std::min(until, a.s->tick(now));
        const size_t begin = fds.size();
        a.s->addPollFds(fds);
        slices.push_back({a, begin, fds.size()});
      }
    }
    // Rounded up: with less than a millisecond left, poll(0) would spin
    // through every service's tick until the time comes.
    const long long ms =
        std::clamp<long long>(std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now()).count(), 0, 1000);
    // A descriptor a detached service closed meanwhile reads POLLNVAL (or, if
    // reused, readable): either only costs an early round.
    if (poll(fds.data(), fds.size(), static_cast<int>(ms)) < 0 && errno != EINTR) 
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (fds[0].revents & POLLIN) {
      uint64_t v;
      (void)!read(pokeFd_, &v, sizeof(v));
    }
    std::lock_guard<std::mutex> g(mu_);
    for (const Slice& sl : slices) {
      const bool attached = std::any_of(services_.begin(), services_.end(),
                                        [&](const Attached& a) { return a.id == sl.a.id; });
      if (attached && sl.end > sl.begin) sl.a.s->polled(fds.data() + sl.begin, sl.end - sl.begin);
    }
  }
}

}  // namespace roce::runtime
