// How Config reads its ROCE_PG_* variables, and the table of what it accepts.
// One set of calls does both: Config::read() on a reader of the environment
// parses it; on a recording reader (no environment: every call returns its
// default) it lists each setting with its accepted values. The extension
// exports that list (roce_pg._C.settings()) for the doctor, which validates
// settings without loading the extension from a copy of it: a setting added
// to read() is in the extension's table at once, with no second list here,
// and tests/test_doctor.py fails until the doctor's copy has it too.
#pragma once
#include <string>
#include <vector>

#include "setting_enums.hpp"

namespace roce {

struct Setting {
  enum class Kind { Integer, Number, Choice, Flag, Text, Token };
  std::string name;
  Kind kind;
  // Integer: strtoll base 0 with an optional K/M/G suffix, in [lo, hi] (or 0
  // when zeroOk). Token: up to `hi` letters, digits, '-' or '_'.
  long long lo = 0, hi = 0;
  bool zeroOk = false;
  double numberLo = 0, numberHi = 0;  // Number: strtod, in [numberLo, numberHi]
  std::vector<std::string> choices;  // Choice
};

class EnvReader {
 public:
  EnvReader() = default;  // reads the process environment
  // Reads nothing (every call returns its default) and appends each setting
  // asked for to `table`.
  explicit EnvReader(std::vector<Setting>& table) : table_(&table) {}

  long long integer(const char* name, long long def, long long lo, long long hi);
  // 0 (off, or auto) or an integer in [lo, hi]; `why` explains the lower bound.
  long long integerOrZero(const char* name, long long def, long long lo, long long hi, const char* why);
  double number(const char* name, double def, double lo, double hi);
  std::string oneOf(const char* name, const std::string& def, const std::vector<const char*>& allowed);
  // The same for a setting with an enum (setting_enums.hpp): its names are the choices.
  template <class E>
  E choice(const char* name, E def) {
    std::vector<const char*> names;
    for (const auto& entry : SettingNames<E>::table) names.push_back(entry.first);
    E value = def;
    settingValue(oneOf(name, settingName(def), names), value);
    return value;
  }
  bool flag(const char* name);                         // 1/true/yes/on or 0/false/no/off
  std::string text(const char* name);                  // any text ("" when unset)
  std::string token(const char* name, size_t maxLen);  // letters, digits, '-', '_' ("" when unset)
  bool isSet(const char* name) const;

 private:
  const char* get(const char* name) const;  // nullptr when unset, empty or recording
  Setting& record(const char* name, Setting::Kind kind);  // a dummy when not recording
  std::vector<Setting>* table_ = nullptr;
  Setting dummy_;
};

}  // namespace roce
