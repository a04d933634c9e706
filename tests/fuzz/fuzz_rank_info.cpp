// RankInfo::decode (csrc/membership/rank_info.hpp) on any text, as a rank
// reads what another published in the store: malformed input raises roce's
// Error and nothing else, and what it accepts encodes and decodes back to
// the same fields.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/error.hpp"
#include "membership/rank_info.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  roce::membership::RankInfo r;
  try {
    r = roce::membership::RankInfo::decode(text, 3);
  } catch (const roce::Error&) {
    return 0;
  }
  const roce::membership::RankInfo again = roce::membership::RankInfo::decode(r.encode(), 3);
  if (again.nodeId != r.nodeId || again.hostId != r.hostId || again.pid != r.pid || again.tcpHost != r.tcpHost ||
      again.tcpPort != r.tcpPort || again.verbsRails != r.verbsRails || again.nonce != r.nonce ||
      again.shmRingBytes != r.shmRingBytes || again.shmSlotBytes != r.shmSlotBytes ||
      again.algorithms != r.algorithms || again.cpus != r.cpus)
    std::abort();
  return 0;
}
