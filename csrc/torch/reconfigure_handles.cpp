#include "reconfigure_handles.hpp"

#include <algorithm>
#include <cctype>
#include <set>

#include "../common/error.hpp"
#include "../common/hex.hpp"

namespace roce::adapter {
namespace {

constexpr const char* kPrefix = "roce:";

[[noreturn]] void notAHandle(const std::string& text, const char* why) {
  throwInvalid(str("reconfigure: '", text, "' is not a roce reconfigure handle (", why,
                   "); pass the strings dist._get_reconfigure_handle() returned on each member's roce group"));
}

}  // namespace

std::string formatReconfigureHandle(const ReconfigureHandle& h) {
  return str(kPrefix, h.stableRank, ":", hex64Padded(h.nonce));
}

ReconfigureHandle parseReconfigureHandle(const std::string& text) {
  const std::string prefix = kPrefix;
  if (text.compare(0, prefix.size(), prefix) != 0) notAHandle(text, "it does not start with roce:");
  const size_t colon = text.find(':', prefix.size());
  if (colon == std::string::npos) notAHandle(text, "no nonce");
  const std::string rank = text.substr(prefix.size(), colon - prefix.size());
  const std::string nonce = text.substr(colon + 1);
  const auto digit = [](unsigned char c) { return std::isdigit(c) != 0; };
  const auto hexDigit = [](unsigned char c) { return std::isxdigit(c) != 0; };
  if (rank.empty() || rank.size() > 18 || !std::all_of(rank.begin(), rank.end(), digit))
    notAHandle(text, "its rank is not a number");
  if (nonce.size() != 16 || !std::all_of(nonce.begin(), nonce.end(), hexDigit))
    notAHandle(text, "its nonce is not 16 hex digits");
  ReconfigureHandle h;
  h.stableRank = std::stoll(rank);
  h.nonce = std::stoull(nonce, nullptr, 16);
  if (formatReconfigureHandle(h) != text) notAHandle(text, "not in the form roce wrote");
  return h;
}

std::vector<std::string> orderReconfigureHandles(std::vector<std::string> listed, bool ordered,
                                                 const std::string& own, int* ownRank) {
  if (listed.empty()) throwInvalid("reconfigure: no handles: pass one handle per member of the new group");
  std::set<std::string> seen;
  for (const auto& h : listed) {
    parseReconfigureHandle(h);
    if (!seen.insert(h).second)
      throwInvalid(str("reconfigure: handle ", h, " is listed twice: each member passes its handle once"));
  }
  if (!ordered) {
    std::sort(listed.begin(), listed.end(), [](const std::string& a, const std::string& b) {
      const ReconfigureHandle x = parseReconfigureHandle(a), y = parseReconfigureHandle(b);
      return x.stableRank != y.stableRank ? x.stableRank < y.stableRank : x.nonce < y.nonce;
    });
  }
  const auto it = std::find(listed.begin(), listed.end(), own);
  if (it == listed.end())
    throwInvalid(str("reconfigure: this process's handle ", own, " is not among the ", listed.size(),
                     " handles passed: every member passes the same handles, its own among them (a process "
                     "left out must not call reconfigure)"));
  *ownRank = static_cast<int>(it - listed.begin());
  return listed;
}

}  // namespace roce::adapter
