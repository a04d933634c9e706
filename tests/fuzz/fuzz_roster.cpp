// Roster::decodeOrThrow (csrc/membership/roster.hpp) on any text, as a
// joining rank reads the leader's answer: the first byte picks the group
// size (1-64), the rest is the text. Malformed input raises roce's Error and
// nothing else; an accepted roster has one entry per rank and encodes and
// decodes back to the same.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/error.hpp"
#include "membership/roster.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int ranks = 1 + data[0] % 64;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  roce::membership::Roster r;
  try {
    r = roce::membership::Roster::decodeOrThrow(text, ranks);
  } catch (const roce::Error&) {
    return 0;
  }
  if (r.ranks.size() != static_cast<size_t>(ranks)) std::abort();
  if (roce::membership::Roster::decode(r.encode(), ranks).encode() != r.encode()) std::abort();
  return 0;
}
