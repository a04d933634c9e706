#include "verdict.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <sstream>

#include "../common/error.hpp"

namespace roce::liveness {
namespace {

struct RankState {
  int rank = -1;
  uint64_t issued = 0, started = 0, ended = 0;
  std::string issuedOp, startedOp, endedOp;
  long long idleMs = 0;
  bool inFlight() const { return started > ended; }
};

bool parse(int rank, const std::string& text, RankState& s) {
  s.rank = rank;
  std::istringstream in(text);
  std::string tok;
  int fields = 0;
  while (in >> tok) {
    const auto eq = tok.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = tok.substr(0, eq), value = tok.substr(eq + 1);
    try {
      if (key == "issued") s.issued = std::stoull(value), ++fields;
      else if (key == "started") s.started = std::stoull(value), ++fields;
      else if (key == "ended") s.ended = std::stoull(value), ++fields;
      else if (key == "idle_ms") s.idleMs = std::stoll(value);
      else if (key == "issued_op") s.issuedOp = value;
      else if (key == "started_op") s.startedOp = value;
      else if (key == "ended_op") s.endedOp = value;
    } catch (const std::exception&) {
      return false;
    }
  }
  return fields == 3;
}

std::string op(const std::string& name, uint64_t seq) {
  if (seq == 0) return "nothing";
  return str(name == "-" || name.empty() ? "collective" : name, " #", seq);
}

std::string seconds(long long ms) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f s", static_cast<double>(ms) / 1000.0);
  return buf;
}

std::string ranksWord(const std::vector<int>& ranks) {
  return str(ranks.size() == 1 ? "rank " : "ranks ", rankList(ranks));
}

}  // namespace

std::string rankList(const std::vector<int>& ranks) {
  std::vector<int> r = ranks;
  std::sort(r.begin(), r.end());
  std::string out;
  for (size_t i = 0; i < r.size();) {
    size_t j = i;
    while (j + 1 < r.size() && r[j + 1] == r[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += j >= i + 2 ? str(r[i], "-", r[j]) : j == i + 1 ? str(r[i], ", ", r[j]) : std::to_string(r[i]);
    i = j + 1;
  }
  return out;
}

std::string formatVerdict(const std::map<int, std::string>& states, int size) {
  std::vector<RankState> all;
  std::vector<int> missing;
  for (int r = 0; r < size; ++r) {
    auto it = states.find(r);
    RankState s;
    if (it == states.end() || !parse(r, it->second, s)) missing.push_back(r);
    else all.push_back(s);
  }
  if (all.empty()) return "";
  // S: the furthest collective any rank has begun; the others are measured against it.
  uint64_t furthest = 0;
  for (const auto& s : all) furthest = std::max(furthest, s.started);

  // Groups, in the order a reader needs them: who is behind, then who waits.
  std::map<std::pair<uint64_t, std::string>, std::vector<const RankState*>> idleBehind, stuckEarlier;
  std::vector<int> waiting, finished, queued;
  for (const auto& s : all) {
    if (s.inFlight() && s.started == furthest) waiting.push_back(s.rank);
    else if (s.inFlight()) stuckEarlier[{s.started, s.startedOp}].push_back(&s);
    else if (s.ended >= furthest) finished.push_back(s.rank);
    else if (s.issued > s.ended) queued.push_back(s.rank);
    else idleBehind[{s.ended, s.endedOp}].push_back(&s);
  }
  std::vector<std::string> parts;
  for (const auto& [key, group] : idleBehind) {
    std::vector<int> ranks;
    long long idle = group.front()->idleMs;
    for (const auto* s : group) ranks.push_back(s->rank), idle = std::min(idle, s->idleMs);
    const bool one = ranks.size() == 1;
    parts.push_back(key.first == 0
                        ? str(ranksWord(ranks), one ? " has" : " have", " called no collective in this group for ",
                              seconds(idle))
                        : str(ranksWord(ranks), " last completed ", op(key.second, key.first), " and ",
                              one ? "has" : "have", " called nothing for ", seconds(idle)));
  }
  for (const auto& [key, group] : stuckEarlier) {
    std::vector<int> ranks;
    for (const auto* s : group) ranks.push_back(s->rank);
    parts.push_back(str(ranksWord(ranks), ranks.size() == 1 ? " is" : " are", " still in ", op(key.second, key.first)));
  }
  const RankState* any = nullptr;
  for (const auto& s : all)
    if (s.started == furthest) any = &s;
  const std::string where = any ? op(any->startedOp, furthest) : op("", furthest);
  if (!queued.empty()) parts.push_back(str(ranksWord(queued), " issued more but began nothing after ", where));
  if (!finished.empty()) parts.push_back(str(ranksWord(finished), " completed ", where));
  if (!waiting.empty()) {
    if (parts.empty() && missing.empty() && waiting.size() == all.size())
      parts.push_back(str("every rank waits in ", where,
                          ": none is behind, so a rank passed other sizes or another collective, or a transport "
                          "is stuck (see each rank's log)"));
    else
      parts.push_back(str(ranksWord(waiting), waiting.size() == 1 ? " waits in " : " wait in ", where));
  }
  if (!missing.empty())
    parts.push_back(str("no answer from ", ranksWord(missing), " (dead, or cut off from the others' lifelines)"));
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : "; ") + p;
  return out;
}

}  // namespace roce::liveness
