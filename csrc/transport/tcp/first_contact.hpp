// What a group of this process does when it first needs a connection to a
// peer's process while other groups may need the same one (one connection per
// pair of processes). Decided by the transport that shares connections
// (TcpMux::firstContact), obeyed by the group's connection manager
// (ConnectionManager::SharedDials), a layer above.
#pragma once

namespace roce::transport::tcp {

enum class FirstContact {
  Linked,  // a connection to the peer's process exists: use it
  Dial,    // nobody else of this process is dialing it: this group dials (claimed until ended)
  Wait,    // another group is dialing it: look again soon
};

}  // namespace roce::transport::tcp
