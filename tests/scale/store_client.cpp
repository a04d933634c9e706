#include "store_client.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "store_wire.hpp"

namespace scale {
namespace {

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error("store client: " + what + ": " + strerror(errno));
}

void writeAll(int fd, const std::string& data) {
  for (size_t done = 0; done < data.size();) {
    const ssize_t n = send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("send");
    done += static_cast<size_t>(n);
  }
}

void readAll(int fd, char* p, size_t len) {
  for (size_t done = 0; done < len;) {
    const ssize_t n = read(fd, p + done, len - done);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) throw std::runtime_error("store client: the launcher's store closed the connection");
    if (n < 0) fail("read");
    done += static_cast<size_t>(n);
  }
}

}  // namespace

StoreClient::StoreClient(int port, std::chrono::milliseconds within) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const auto deadline = std::chrono::steady_clock::now() + within;
  for (;;) {
    roce::UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (fd.get() < 0) fail("socket");
    if (connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      const int one = 1;
      setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      fd_ = std::move(fd);
      return;
    }
    // The listener exists before any rank starts, so a refusal means its
    // queue overflowed (thousands of ranks at once): try again shortly.
    if ((errno != ECONNREFUSED && errno != EAGAIN && errno != EINTR) || std::chrono::steady_clock::now() > deadline)
      fail("connect to 127.0.0.1:" + std::to_string(port));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::string StoreClient::call(const std::string& frame) {
  writeAll(fd_.get(), frame);
  char header[kFrameHeaderBytes];
  readAll(fd_.get(), header, sizeof header);
  const uint32_t len = frameLength(header);
  if (len > kMaxFrameBytes) throw std::runtime_error("store client: reply over the frame limit");
  std::string body(len, '\0');
  readAll(fd_.get(), body.data(), len);
  return body;
}

void StoreClient::set(const std::string& key, const std::string& value) {
  call(Writer(Op::Set).str(key).str(value).frame());
}

int64_t StoreClient::add(const std::string& key, int64_t delta) {
  const std::string body = call(Writer(Op::Add).str(key).i64(delta).frame());
  return Reader(body).i64();
}

bool StoreClient::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const std::string body =
      call(Writer(Op::Wait).strs(keys).i64(timeout.count()).frame());
  return Reader(body).u8() != 0;
}

std::vector<std::string> StoreClient::multiGet(const std::vector<std::string>& keys) {
  const std::string body = call(Writer(Op::MultiGet).strs(keys).frame());
  Reader in(body);
  if (!in.u8()) throw std::runtime_error("store client: multi-get of keys that do not all exist");
  return in.strs();
}

bool StoreClient::check(const std::string& key) {
  const std::string body = call(Writer(Op::Check).str(key).frame());
  return Reader(body).u8() != 0;
}

}  // namespace scale
