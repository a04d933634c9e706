#include "setting_choices.hpp"

#include <map>
#include <mutex>
#include <string>

namespace roce {
namespace {

struct Registered {
  std::mutex mutex;
  std::map<std::string, std::vector<const char*>> values;
};

// Built on first use: registrations run from other files' static initialisers,
// whose order relative to this file's is unspecified.
Registered& registered() {
  static Registered r;
  return r;
}

}  // namespace

void addSettingChoice(const char* setting, const char* value) {
  Registered& r = registered();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.values[setting].push_back(value);
}

std::vector<const char*> settingChoices(const char* setting, std::vector<const char*> fixed) {
  Registered& r = registered();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = r.values.find(setting);
  if (it != r.values.end()) fixed.insert(fixed.end(), it->second.begin(), it->second.end());
  return fixed;
}

}  // namespace roce
