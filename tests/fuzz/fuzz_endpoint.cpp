// Endpoint::parse (csrc/transport/verbs/verbs_endpoint.hpp) on any text, as a
// rank reads the verbs endpoint a peer sent over their side channel: the
// first byte picks the queue-pair count this side expects, the rest is the
// text. Malformed input raises roce's Error and nothing else, and what it
// accepts encodes and parses back to the same fields.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/error.hpp"
#include "transport/verbs/verbs_endpoint.hpp"

using roce::transport::verbs::Endpoint;

namespace {

bool same(const Endpoint& a, const Endpoint& b) {
  if (a.rails.size() != b.rails.size() || a.qps.size() != b.qps.size() || a.grants.size() != b.grants.size())
    return false;
  for (size_t i = 0; i < a.rails.size(); ++i)
    if (a.rails[i].lid != b.rails[i].lid || a.rails[i].mtu != b.rails[i].mtu ||
        std::memcmp(a.rails[i].gid.raw, b.rails[i].gid.raw, 16) != 0)
      return false;
  for (size_t i = 0; i < a.qps.size(); ++i)
    if (a.qps[i].qpn != b.qps[i].qpn || a.qps[i].rail != b.qps[i].rail) return false;
  for (size_t i = 0; i < a.grants.size(); ++i) {
    if (a.grants[i].id != b.grants[i].id || a.grants[i].addr != b.grants[i].addr) return false;
    for (size_t r = 0; r < a.rails.size(); ++r)
      if (a.grants[i].rkey[r] != b.grants[i].rkey[r]) return false;
  }
  return a.psn == b.psn && a.slotBytes == b.slotBytes && a.stride == b.stride && a.ctrlRecvs == b.ctrlRecvs;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int expectQps = 1 + data[0] % 16;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  Endpoint e;
  try {
    e = Endpoint::parse(text, 1, expectQps, 0);
  } catch (const roce::Error&) {
    return 0;
  }
  if (static_cast<int>(e.qps.size()) != expectQps) std::abort();
  if (!same(Endpoint::parse(e.encode(), 1, expectQps, 0), e)) std::abort();
  return 0;
}
