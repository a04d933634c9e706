// The handles of reconfigure (torch's fault-tolerance API): the opaque string
// a process gives out (dist._get_reconfigure_handle), which the members of
// the next membership exchange out of band and all pass to reconfigure.
// "roce:<stable rank>:<nonce>": the stable rank is the process's rank in the
// world it started in (it orders a set of handles, so survivors keep their
// relative order), the nonce is random per group object (a replacement
// started with a dead process's rank still differs from it).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace roce::adapter {

struct ReconfigureHandle {
  int64_t stableRank = 0;
  uint64_t nonce = 0;
};

std::string formatReconfigureHandle(const ReconfigureHandle& h);
// Throws roce::Error(Invalid) naming `text` when it is no roce handle.
ReconfigureHandle parseReconfigureHandle(const std::string& text);

// The members in rank order: `listed` as given (ordered = true, a list
// assigns ranks by position) or sorted by stable rank, then nonce (a set:
// roce chooses). Throws Error(Invalid) on an empty list, a duplicate, a
// string that is no handle, or when `own` is not among them; returns own's
// position in *ownRank.
std::vector<std::string> orderReconfigureHandles(std::vector<std::string> listed, bool ordered,
                                                 const std::string& own, int* ownRank);

}  // namespace roce::adapter
