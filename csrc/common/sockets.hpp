// Socket options every TCP connection of roce gets.
#pragma once
#include <string>

namespace roce {

// Where a process reaches the others on its own machine, and where its
// listener is always bound beside the advertised address.
inline constexpr const char* kLoopbackAddress = "127.0.0.1";

void setNonBlocking(int fd, bool on);
// TCP_NODELAY, and keepalive probes so that a peer machine that vanished is
// noticed by the kernel even when no data flows.
void tuneSocket(int fd);
// "a.b.c.d:port" of the remote end ("?" if none).
std::string peerAddress(int fd);
// "a.b.c.d" of the remote end ("?" if none).
std::string peerIp(int fd);

}  // namespace roce
