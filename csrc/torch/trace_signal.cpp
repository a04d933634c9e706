#include "trace_signal.hpp"

#include <cstdint>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "../common/error.hpp"
#include "../common/log.hpp"

namespace roce::adapter {
namespace {

struct Registry {
  std::mutex mu;  // held while dumping, so remove() waits for a dump in progress
  std::map<uint64_t, std::function<void()>> dumps;
  uint64_t next = 1;
  int fd = -1;
  bool installed[NSIG] = {};
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: the thread and the handler use it until exit
  return *r;
}

int g_fd = -1;  // what the handler writes to; set before the handler is installed

void onSignal(int) {
  const int saved = errno;
  uint64_t one = 1;
  (void)!write(g_fd, &one, sizeof(one));
  errno = saved;
}

void dumpLoop(int fd) {
  for (;;) {
    uint64_t n;
    if (read(fd, &n, sizeof(n)) != sizeof(n)) {
      if (errno == EINTR) continue;
      return;
    }
    Registry& r = registry();
    std::lock_guard<std::mutex> g(r.mu);
    for (auto& [id, dump] : r.dumps) {
      try {
        dump();
      } catch (const std::exception& e) {
        ROCE_WARN("roce: dumping a trace on signal failed: ", e.what());
      }
    }
  }
}

}  // namespace

uint64_t TraceSignal::add(int signo, std::function<void()> dump) {
  if (signo <= 0 || signo >= NSIG) throwInvalid(str("internal: no signal ", signo));
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  if (r.fd < 0) {
    r.fd = eventfd(0, EFD_CLOEXEC);
    if (r.fd < 0) throwComm(str("eventfd() for ROCE_PG_TRACE_SIGNAL failed: ", std::strerror(errno)));
    g_fd = r.fd;
    std::thread(dumpLoop, r.fd).detach();
  }
  if (!r.installed[signo]) {
    struct sigaction sa {};
    sa.sa_handler = onSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    if (sigaction(signo, &sa, nullptr) != 0)
      throwComm(str("installing the handler of signal ", signo, " (ROCE_PG_TRACE_SIGNAL) failed: ",
                    std::strerror(errno)));
    r.installed[signo] = true;
  }
  const uint64_t id = r.next++;
  r.dumps.emplace(id, std::move(dump));
  return id;
}

void TraceSignal::remove(uint64_t id) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  r.dumps.erase(id);
}

}  // namespace roce::adapter
