#include "report.hpp"

#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace scale {

// One item per line: "checks N", "error TEXT" (its newlines made " | "), "METRIC VALUE".
std::string RankReport::encode() const {
  std::ostringstream out;
  out << "checks " << checksPassed << "\n";
  for (const auto& [name, value] : metrics) {
    char v[32];
    std::snprintf(v, sizeof v, "%.17g", value);
    out << name << " " << v << "\n";
  }
  if (!error.empty()) {
    std::string oneLine = error;
    for (size_t at; (at = oneLine.find('\n')) != std::string::npos;) oneLine.replace(at, 1, " | ");
    out << "error " << oneLine << "\n";
  }
  return out.str();
}

RankReport RankReport::decode(const std::string& text) {
  RankReport r;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const size_t space = line.find(' ');
    const std::string name = line.substr(0, space), value = space == std::string::npos ? "" : line.substr(space + 1);
    if (name == "checks") r.checksPassed = std::atoi(value.c_str());
    else if (name == "error") r.error = value;
    else r.metrics[name] = std::strtod(value.c_str(), nullptr);
  }
  return r;
}

}  // namespace scale
