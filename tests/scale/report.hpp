// What a rank tells the launcher, through the store (key report/<rank>):
// named measurements, how many checks passed, and the error that ended it.
#pragma once
#include <map>
#include <string>

namespace scale {

struct RankReport {
  std::map<std::string, double> metrics;
  int checksPassed = 0;
  std::string error;  // empty when the rank completed everything

  std::string encode() const;
  static RankReport decode(const std::string& text);
};

}  // namespace scale
