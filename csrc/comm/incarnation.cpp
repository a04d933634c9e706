#include "incarnation.hpp"

#include <cctype>
#include <cstdlib>

#include "../common/bootstrap.hpp"
#include "../common/error.hpp"

namespace roce {
namespace {

// Store keys are strings, but a run id comes from the user: keep it short and tame.
std::string tame(const char* v) {
  std::string out;
  for (const char* p = v; *p && out.size() < 64; ++p)
    out += std::isalnum(static_cast<unsigned char>(*p)) || *p == '-' || *p == '_' || *p == '.' ? *p : '_';
  return out;
}

std::string scopeFromEnv() {
  const char* run = std::getenv("TORCHELASTIC_RUN_ID");
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
  if (!restart || !*restart) return "local";
  return str("elastic.", tame(run && *run ? run : "none"), ".", tame(restart));
}

std::string generationKey(const std::string& scope, int rank) { return str("roce/", scope, "/gen/", rank); }

}  // namespace

std::string Incarnation::prefix() const { return str("roce/", scope, "/", generation, "/"); }

Incarnation joinIncarnation(Bootstrap& store, int rank) {
  Incarnation inc;
  inc.scope = scopeFromEnv();
  inc.generation = store.add(generationKey(inc.scope, rank), 1);
  return inc;
}

std::string replacedRanks(Bootstrap& store, const Incarnation& inc, const std::vector<int>& peers) {
  std::string out;
  for (int r : peers) {
    const int64_t g = store.add(generationKey(inc.scope, r), 0);
    if (g > inc.generation)
      out += str(out.empty() ? "" : "; ", "rank ", r, " is at incarnation ", g, " of this group (scope ",
                 inc.scope, ") while this one is ", inc.generation);
  }
  return out;
}

}  // namespace roce
