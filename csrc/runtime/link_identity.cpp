#include "link_identity.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include "../common/error.hpp"
#include "../common/sockets.hpp"

namespace roce::runtime {

std::string keyAddress(const std::string& key) {
  // The host id may hold slashes (a simulated machine's does); the address does not.
  const size_t colon = key.rfind(':');
  const size_t slash = colon == std::string::npos ? std::string::npos : key.rfind('/', colon);
  if (slash == std::string::npos || colon == std::string::npos || colon <= slash + 1) return {};
  return key.substr(slash + 1, colon - slash - 1);
}

std::string nameMismatch(const std::string& key, const std::string& source,
                         const std::function<bool(const std::string&)>& isLocal) {
  const std::string address = keyAddress(key);
  if (address.empty()) return str("it names '", key, "', which is not a process key (hostId/address:port)");
  if (address == source) return {};
  // Peers on this machine dial 127.0.0.1 (group/group_builder.cpp).
  if (source == kLoopbackAddress && isLocal(address)) return {};
  return str("it came from ", source, " but names process ", key, " at ", address,
             ": a process link must come from the address its process advertises (the dialer binds its "
             "connections to it; a NAT between the machines, or an address that is not the dialer's own, "
             "breaks that: set ROCE_PG_SOCKET_IFNAME to the interface the machines reach each other by)");
}

bool isLocalAddress(const std::string& address) {
  in_addr want{};
  if (inet_pton(AF_INET, address.c_str(), &want) != 1) return false;
  if ((ntohl(want.s_addr) >> 24) == 127) return true;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return false;
  bool found = false;
  for (ifaddrs* a = list; a && !found; a = a->ifa_next)
    found = a->ifa_addr && a->ifa_addr->sa_family == AF_INET &&
            reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr == want.s_addr;
  freeifaddrs(list);
  return found;
}

}  // namespace roce::runtime
