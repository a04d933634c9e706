#include "verbs_endpoint.hpp"

#include <cstdint>
#include <sstream>

#include "../../common/error.hpp"
#include "../../common/parse.hpp"
#include "port_choice.hpp"
#include "verbs_wire.hpp"

namespace roce::transport::verbs {
namespace {

std::string hex(const void* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t b = static_cast<const uint8_t*>(p)[i];
    s += d[b >> 4];
    s += d[b & 15];
  }
  return s;
}

bool unhex(const std::string& s, void* p, size_t n) {
  if (s.size() != 2 * n) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < n; ++i) {
    const int hi = nibble(s[2 * i]), lo = nibble(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return true;
}

}  // namespace

std::string Endpoint::encode() const {
  std::ostringstream os;
  os << rails.size();
  for (const Rail& r : rails) os << " " << r.lid << " " << hex(r.gid.raw, 16) << " " << r.mtu;
  os << " " << qps.size();
  for (const Qp& q : qps) os << " " << q.qpn << " " << q.rail;
  os << " " << psn << " " << slotBytes << " " << stride << " " << ctrlRecvs << " " << grants.size();
  for (const Grant& g : grants) {
    os << " " << g.id << " " << g.addr;
    for (size_t r = 0; r < rails.size(); ++r) os << " " << g.rkey[r];
  }
  return os.str();
}

Endpoint Endpoint::parse(const std::string& text, int peer, int expectQps, int self) {
  std::istringstream in(text);
  auto fail = [&](const std::string& what) -> Endpoint {
    throwComm(str("rank ", peer, " sent an invalid verbs endpoint (", what,
                  "): mixed roce_pg versions across ranks, or something else answered on its port"));
  };
  auto next = [&](uint64_t lo, uint64_t hi, const char* what) -> uint64_t {
    std::string tok;
    uint64_t v = 0;
    if (!(in >> tok) || !parseU64(tok, 0, UINT64_MAX, v)) fail(str(what, " missing or not a number"));
    if (v < lo || v > hi) fail(str(what, "=", v, " outside [", lo, ", ", hi, "]"));
    return v;
  };
  Endpoint e;
  const auto nr = static_cast<int>(next(1, kMaxRails, "rail count"));
  for (int r = 0; r < nr; ++r) {
    Rail rail;
    rail.lid = static_cast<uint32_t>(next(0, 0xffff, "LID"));
    std::string gidHex;
    if (!(in >> gidHex) || !unhex(gidHex, rail.gid.raw, 16)) fail("GID");
    rail.mtu = static_cast<int>(next(IBV_MTU_256, IBV_MTU_4096, "MTU"));
    e.rails.push_back(rail);
  }
  const auto nq = static_cast<int>(next(1, 16, "queue pair count"));
  if (nq != expectQps)
    throwInvalid(str("rank ", peer, " uses ", nq, " queue pairs per connection but rank ", self, " uses ",
                     expectQps, " (the larger of ROCE_PG_IB_QPS_PER_CONNECTION and the channel count): set the same "
                     "ROCE_PG_IB_QPS_PER_CONNECTION on every rank"));
  for (int q = 0; q < nq; ++q) {
    Qp qp;
    qp.qpn = static_cast<uint32_t>(next(1, 0xffffff, "QPN"));
    qp.rail = static_cast<uint32_t>(next(0, nr - 1, "queue pair's rail"));
    e.qps.push_back(qp);
  }
  e.psn = static_cast<uint32_t>(next(0, 0xffffff, "PSN"));
  e.slotBytes = next(1, 1ull << 30, "slot size");
  e.stride = next(sizeof(SlotHeader) + e.slotBytes, 1ull << 31, "slot stride");
  if (e.stride % 64) fail("slot stride not 64-byte aligned");
  e.ctrlRecvs = static_cast<uint32_t>(next(kCtrlReserve + 4, 1 << 20, "control receive count"));
  const auto grants = next(0, 1024, "grant count");
  for (uint64_t i = 0; i < grants; ++i) {
    Grant g;
    g.id = static_cast<uint32_t>(next(0, UINT32_MAX, "granted slot"));
    g.addr = next(1, UINT64_MAX, "granted slot's address");
    for (int r = 0; r < nr; ++r) g.rkey[r] = static_cast<uint32_t>(next(0, UINT32_MAX, "granted slot's rkey"));
    for (const Grant& earlier : e.grants)
      if (earlier.id == g.id) fail(str("landing slot ", g.id, " granted twice"));
    e.grants.push_back(g);
  }
  return e;
}

}  // namespace roce::transport::verbs
