#include "store_server.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <stdexcept>

#include "store_wire.hpp"

namespace scale {
namespace {

void setNonBlocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

void watch(int epfd, int op, int fd, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  if (epoll_ctl(epfd, op, fd, &ev) != 0) throw std::runtime_error(std::string("epoll_ctl: ") + strerror(errno));
}

}  // namespace

StoreServer::StoreServer(roce::UniqueFd listener) : listener_(std::move(listener)), epoll_(epoll_create1(EPOLL_CLOEXEC)) {
  if (epoll_.get() < 0) throw std::runtime_error(std::string("epoll_create1: ") + strerror(errno));
  setNonBlocking(listener_.get());
  watch(epoll_.get(), EPOLL_CTL_ADD, listener_.get(), EPOLLIN);
}

StoreServer::~StoreServer() {
  for (auto& [fd, c] : clients_) close(fd);
}

const std::string* StoreServer::find(const std::string& key) const {
  auto it = values_.find(key);
  return it == values_.end() ? nullptr : &it->second;
}

void StoreServer::serveFor(std::chrono::milliseconds timeout) {
  if (!deadlines_.empty()) {
    const auto untilFirst =
        std::chrono::ceil<std::chrono::milliseconds>(deadlines_.begin()->first - Clock::now());
    timeout = std::clamp(untilFirst, std::chrono::milliseconds(0), timeout);
  }
  epoll_event events[256];
  const int n = epoll_wait(epoll_.get(), events, 256, static_cast<int>(timeout.count()));
  if (n < 0 && errno != EINTR) throw std::runtime_error(std::string("epoll_wait: ") + strerror(errno));
  for (int i = 0; i < n; ++i) {
    const int fd = events[i].data.fd;
    if (fd == listener_.get()) {
      acceptAll();
      continue;
    }
    auto it = clients_.find(fd);
    if (it == clients_.end()) continue;
    Client& c = *it->second;
    if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) readFrom(c);
    if (events[i].events & EPOLLOUT) writeTo(c);
  }
  expireWaits();
  // Descriptors close only now, so none is reused while its events are pending.
  for (int fd : doomed_) drop(fd);
  doomed_.clear();
}

void StoreServer::acceptAll() {
  for (;;) {
    const int fd = accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      if (errno == ECONNABORTED) continue;
      throw std::runtime_error(std::string("store accept: ") + strerror(errno));
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    watch(epoll_.get(), EPOLL_CTL_ADD, fd, EPOLLIN);
    clients_[fd] = std::make_unique<Client>(Client{fd});
  }
}

void StoreServer::readFrom(Client& c) {
  char buf[64 << 10];
  for (;;) {
    const ssize_t got = read(c.fd, buf, sizeof buf);
    if (got > 0) {
      c.in.append(buf, static_cast<size_t>(got));
      continue;
    }
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (got < 0 && errno == EINTR) continue;
    doomed_.push_back(c.fd);  // closed by the rank (it exited), or broken
    return;
  }
  try {
    handleRequests(c);
  } catch (const std::exception&) {
    doomed_.push_back(c.fd);  // a malformed request: this is no harness client
  }
}

void StoreServer::handleRequests(Client& c) {
  size_t pos = 0;
  while (c.waiter == 0 && c.in.size() - pos >= kFrameHeaderBytes) {
    const uint32_t len = frameLength(c.in.data() + pos);
    if (len > kMaxFrameBytes) throw std::runtime_error("store request over the frame limit");
    if (c.in.size() - pos - kFrameHeaderBytes < len) break;
    ++traffic_.requests;
    traffic_.bytesIn += kFrameHeaderBytes + len;
    handle(c, c.in.substr(pos + kFrameHeaderBytes, len));
    pos += kFrameHeaderBytes + len;
  }
  c.in.erase(0, pos);
}

void StoreServer::handle(Client& c, const std::string& body) {
  Reader in(body);
  const auto op = static_cast<Op>(in.u8());
  switch (op) {
    case Op::Set: {
      std::string key = in.str();
      const bool isNew = !values_.count(key);
      values_[key] = in.str();
      reply(c, Writer().frame());
      if (isNew) keyCreated(key);
      return;
    }
    case Op::Get: {
      const std::string* v = find(in.str());
      reply(c, Writer().u8(v != nullptr).str(v ? *v : std::string()).frame());
      return;
    }
    case Op::Add: {
      std::string key = in.str();
      const int64_t delta = in.i64();
      auto [it, isNew] = values_.try_emplace(key, "0");
      const int64_t value = std::stoll(it->second) + delta;
      it->second = std::to_string(value);  // decimal, as c10d stores counters
      reply(c, Writer().i64(value).frame());
      if (isNew) keyCreated(key);
      return;
    }
    case Op::Check:
      reply(c, Writer().u8(values_.count(in.str()) > 0).frame());
      return;
    case Op::Wait: {
      const auto keys = in.strs();
      startWait(c, keys, std::chrono::milliseconds(in.i64()));
      return;
    }
    case Op::MultiGet: {
      const auto keys = in.strs();
      std::vector<std::string> out;
      out.reserve(keys.size());
      bool all = true;
      for (const auto& k : keys) {
        const std::string* v = find(k);
        all = all && v;
        out.push_back(v ? *v : std::string());
      }
      reply(c, Writer().u8(all).strs(out).frame());
      return;
    }
  }
  throw std::runtime_error("unknown store request");
}

void StoreServer::startWait(Client& c, const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::set<std::string> missing;
  for (const auto& k : keys)
    if (!values_.count(k)) missing.insert(k);
  if (missing.empty()) return reply(c, Writer().u8(1).frame());
  const uint64_t id = nextWaiter_++;
  for (const auto& k : missing) waitingOn_[k].push_back(id);
  waiters_[id] = Waiter{c.fd, missing.size(), deadlines_.emplace(Clock::now() + timeout, id)};
  c.waiter = id;
}

void StoreServer::finishWait(uint64_t id, bool allExist) {
  auto it = waiters_.find(id);
  const int fd = it->second.fd;
  deadlines_.erase(it->second.deadline);
  waiters_.erase(it);
  Client& c = *clients_.at(fd);
  c.waiter = 0;
  reply(c, Writer().u8(allExist).frame());
  handleRequests(c);  // whatever queued behind the wait
}

void StoreServer::keyCreated(const std::string& key) {
  auto it = waitingOn_.find(key);
  if (it == waitingOn_.end()) return;
  const std::vector<uint64_t> ids = std::move(it->second);
  waitingOn_.erase(it);
  for (uint64_t id : ids) {
    auto w = waiters_.find(id);
    if (w != waiters_.end() && --w->second.missing == 0) finishWait(id, true);
  }
}

void StoreServer::expireWaits() {
  const auto now = Clock::now();
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) finishWait(deadlines_.begin()->second, false);
}

void StoreServer::reply(Client& c, const std::string& frame) {
  traffic_.bytesOut += frame.size();
  c.out += frame;
  writeTo(c);
}

void StoreServer::writeTo(Client& c) {
  while (!c.out.empty()) {
    const ssize_t put = send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
    if (put > 0) {
      c.out.erase(0, static_cast<size_t>(put));
      continue;
    }
    if (put < 0 && errno == EINTR) continue;
    if (put < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    doomed_.push_back(c.fd);
    return;
  }
  // Watch for room only while a reply is stuck (level-triggered epoll).
  const bool wantOut = !c.out.empty();
  if (wantOut != c.watchingOut) {
    watch(epoll_.get(), EPOLL_CTL_MOD, c.fd, EPOLLIN | (wantOut ? EPOLLOUT : 0));
    c.watchingOut = wantOut;
  }
}

void StoreServer::drop(int fd) {
  auto it = clients_.find(fd);
  if (it == clients_.end()) return;  // doomed twice in one batch
  if (uint64_t id = it->second->waiter) {
    auto w = waiters_.find(id);
    deadlines_.erase(w->second.deadline);
    waiters_.erase(w);
  }
  epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
  close(fd);
  clients_.erase(it);
}

}  // namespace scale
