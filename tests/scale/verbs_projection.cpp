#include "verbs_projection.hpp"

#include <algorithm>
#include <cstdlib>

#include "../../csrc/common/config.hpp"
#include "../../csrc/common/parse.hpp"

namespace scale {
namespace {

constexpr size_t kSlotHeaderBytes = 64;  // verbs SlotHeader, before each landing slot's payload
constexpr size_t kCtrlBytes = 64;        // one control message buffer
constexpr int kCtrlRecvs = 32;           // control receives posted per peer beside the data slots
constexpr int kSqDepth = 128;            // minimum send queue depth

size_t envBytes(const char* name, size_t fallback) {
  const char* v = std::getenv(name);
  uint64_t out;
  return v && roce::parseU64(v, 1, UINT64_MAX, out) ? out : fallback;
}

size_t roundPage(size_t n) { return (n + 4095) & ~size_t(4095); }

}  // namespace

size_t projectedVerbsBytes(const roce::Config& cfg, int peers) {
  const size_t poolBytes = envBytes("ROCE_PG_IB_POOL_BYTES", 16u << 20);
  const size_t slotBytes = envBytes("ROCE_PG_IB_SLOT_BYTES", 64u << 10);
  const size_t stride = (kSlotHeaderBytes + slotBytes + 63) & ~size_t(63);
  const size_t landing = roundPage(poolBytes / stride * stride);
  const size_t staging = roundPage(std::max(poolBytes / 4, 2 * stride) / stride * stride);
  const int qps = std::max(cfg.ibQpsPerConnection, cfg.nChannels);
  const int recvDepth = cfg.ibSlots + kCtrlRecvs + 4;
  const int sendDepth = std::max(kSqDepth, 2 * cfg.ibSlots + 64);
  const size_t perPeer = static_cast<size_t>(qps) * static_cast<size_t>(recvDepth + sendDepth) * kCtrlBytes;
  return landing + staging + static_cast<size_t>(peers) * perPeer;
}

}  // namespace scale
