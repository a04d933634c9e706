// The name an accepted process link gives itself against the address it
// came from (csrc/runtime/link_identity.hpp): the same address, or a dial
// over 127.0.0.1 naming an address of this machine; anything else refused
// with a reason that names both addresses and the setting to look at.
#include <string>

#include "roce_check.hpp"
#include "runtime/link_identity.hpp"

namespace {
using roce::runtime::nameMismatch;

// This "machine" owns 10.0.0.5 (and loopback).
bool local(const std::string& a) { return a == "10.0.0.5" || a.rfind("127.", 0) == 0; }
}  // namespace

TEST(the_address_part_of_a_key) {
  CHECK_EQ(roce::runtime::keyAddress("host-a/10.0.0.5:4000"), std::string("10.0.0.5"));
  CHECK_EQ(roce::runtime::keyAddress("vm/5f9b-c9fb/10.0.0.5:4000"), std::string("10.0.0.5"));  // a simulated host id
  CHECK_EQ(roce::runtime::keyAddress("no-slash:4000"), std::string());
  CHECK_EQ(roce::runtime::keyAddress("host/:4000"), std::string());
  CHECK_EQ(roce::runtime::keyAddress("host/10.0.0.5"), std::string());
}

TEST(a_name_fits_its_own_address_or_a_loopback_dial_of_this_machine) {
  CHECK(nameMismatch("host-b/10.0.0.7:4000", "10.0.0.7", local).empty());
  CHECK(nameMismatch("host-a/10.0.0.5:4001", "127.0.0.1", local).empty());
  CHECK(nameMismatch("sim-1/127.0.0.1:4002", "127.0.0.1", local).empty());
}

TEST(anything_else_is_refused_naming_both_addresses) {
  // Another machine claiming a peer's name.
  const std::string why = nameMismatch("host-b/10.0.0.7:4000", "10.0.0.9", local);
  CHECK(why.find("10.0.0.9") != std::string::npos && why.find("10.0.0.7") != std::string::npos);
  CHECK(why.find("ROCE_PG_SOCKET_IFNAME") != std::string::npos);
  // Over loopback, a name of another machine; from another loopback address
  // than the one peers dial from; a name that is not a key.
  CHECK(!nameMismatch("host-b/10.0.0.7:4000", "127.0.0.1", local).empty());
  CHECK(!nameMismatch("host-a/10.0.0.5:4000", "127.0.0.2", local).empty());
  CHECK(nameMismatch("stranger", "10.0.0.7", local).find("not a process key") != std::string::npos);
}
