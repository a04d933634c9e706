// Whether the name an accepted process link gives itself (its process key,
// process_links.hpp: "hostId/address:port") fits the address the connection
// came from. The job secret proves a dialer belongs to the job, not which
// process it is: bound to its source address, a link may only name a
// process of the machine it came from, so nobody elsewhere can take over a
// peer's link (its groups' records would go to the impostor and the peer
// would be judged hung). A dial over loopback (from 127.0.0.1) comes from
// this machine and may name any process whose address is one of this
// machine's; processes of one machine are not told apart.
#pragma once
#include <functional>
#include <string>

namespace roce::runtime {

// The address part of a process key ("" if the key has none): between the
// last '/' and the last ':'.
std::string keyAddress(const std::string& key);

// "" if `key` fits a connection from `source` (an IPv4 address as
// inet_ntop writes it), else why not, for the refusal: `isLocal` says
// whether an address belongs to this machine.
std::string nameMismatch(const std::string& key, const std::string& source,
                         const std::function<bool(const std::string&)>& isLocal);

// Whether `address` is one of this machine's IPv4 interface addresses.
bool isLocalAddress(const std::string& address);

}  // namespace roce::runtime
