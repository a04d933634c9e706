// The reconfigure handles' parser and ordering (csrc/torch/reconfigure_handles.hpp)
// on any bytes: the input's lines are the handles a caller passed, its first
// byte says list or set and which line is the caller's own. Either the call
// throws roce::Error, or it accepted only strings that print back exactly,
// returned a permutation of them with the caller's at *ownRank, and a set
// came back ordered by (stable rank, nonce).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "torch/reconfigure_handles.hpp"

using roce::adapter::formatReconfigureHandle;
using roce::adapter::orderReconfigureHandles;
using roce::adapter::parseReconfigureHandle;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool ordered = data[0] & 1;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::vector<std::string> handles;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t end = std::min(text.find('\n', at), text.size());
    handles.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  for (const auto& h : handles) {
    try {
      if (formatReconfigureHandle(parseReconfigureHandle(h)) != h) std::abort();
    } catch (const roce::Error&) {
    }
  }
  const std::string own = handles[(data[0] >> 1) % handles.size()];
  int ownRank = -1;
  std::vector<std::string> members;
  try {
    members = orderReconfigureHandles(handles, ordered, own, &ownRank);
  } catch (const roce::Error&) {
    return 0;
  }
  if (ownRank < 0 || static_cast<size_t>(ownRank) >= members.size() || members[ownRank] != own) std::abort();
  std::vector<std::string> a = members, b = handles;
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  if (a != b) std::abort();
  if (ordered && members != handles) std::abort();
  for (size_t i = 1; !ordered && i < members.size(); ++i) {
    const auto x = parseReconfigureHandle(members[i - 1]), y = parseReconfigureHandle(members[i]);
    if (x.stableRank > y.stableRank || (x.stableRank == y.stableRank && x.nonce >= y.nonce)) std::abort();
  }
  return 0;
}
