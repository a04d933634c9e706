// How Config reads its ROCE_PG_* variables, and the table of what it accepts.
// Each setting is declared once, by the call that reads it: its name, which
// layer reads it and what the ranks of a group must agree on (a Key), its
// kind, default and range or choices (the call). One set of calls does
// everything: Config::read() on a reader of the environment parses it and
// keeps each value's canonical text (from which the settings ranks compare
// come, Config::algorithmSettings()); on a recording reader (no environment:
// every call returns its default) it lists each setting with its
// declaration. The extension exports that list (roce_pg._C.settings() and
// setting_declarations()), from which the build writes the doctor's copy
// (roce_pg/_settings_table.py), so a setting added to read() needs no second
// list anywhere.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "setting_enums.hpp"

namespace roce {

// What the ranks of a group must agree on, for one setting.
enum class Scope : uint8_t {
  Rank,     // each rank its own value
  Group,    // the same on every rank of a group: formation compares the values
  Advised,  // should be the same everywhere but is not compared: a difference fails
            // with an error of its own (the doctor's cluster check compares it)
  Machine,  // the same on every rank of a machine (shared-memory layouts): checked
            // there with an error of its own; machines may differ
};
const char* scopeName(Scope s);

// A setting's declaration apart from its kind: made by perRank / sameInGroup
// / advised / sameOnMachine below, so that every read says what the ranks must agree on.
struct Key {
  const char* name;
  const char* layer;  // the csrc/ folder that reads it (docs/ARCHITECTURE.md's layers)
  Scope scope;
  // Decides where ranks are and which transport joins them (Config::placementSettings).
  bool placement = false;
  // Unset is a value of its own ("auto": e.g. a threshold left to the cost
  // model), which the default set explicitly is not: compared as such.
  bool unsetIsAuto = false;
  constexpr Key alsoPlacement() const { Key k = *this; k.placement = true; return k; }
  constexpr Key unsetMeansAuto() const { Key k = *this; k.unsetIsAuto = true; return k; }
};
constexpr Key perRank(const char* name, const char* layer) { return Key{name, layer, Scope::Rank}; }
constexpr Key sameInGroup(const char* name, const char* layer) { return Key{name, layer, Scope::Group}; }
constexpr Key advised(const char* name, const char* layer) { return Key{name, layer, Scope::Advised}; }
constexpr Key sameOnMachine(const char* name, const char* layer) { return Key{name, layer, Scope::Machine}; }

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
  std::string layer;
  Scope scope = Scope::Rank;
  bool placement = false;
};

// A setting's value as read, in canonical text: integers in decimal, numbers
// in the shortest text that reads back exactly (two ranks whose values differ
// in the last bit must not print alike), flags 1/0, "auto" for an unset
// unsetMeansAuto() setting.
struct SettingValue {
  const char* name;
  Scope scope;
  bool placement;
  std::string text;
};

class EnvReader {
 public:
  // Reads the process environment; keeps each value read in `values` when given.
  explicit EnvReader(std::vector<SettingValue>* values = nullptr) : values_(values) {}
  // Reads nothing (every call returns its default) and appends each setting
  // asked for to `table`.
  explicit EnvReader(std::vector<Setting>& table) : table_(&table) {}

  long long integer(const Key& key, long long def, long long lo, long long hi);
  // 0 (off, or auto) or an integer in [lo, hi]; `why` explains the lower bound.
  long long integerOrZero(const Key& key, long long def, long long lo, long long hi, const char* why);
  double number(const Key& key, double def, double lo, double hi);
  std::string oneOf(const Key& key, const std::string& def, const std::vector<const char*>& allowed);
  // The same for a setting with an enum (setting_enums.hpp): its names are the choices.
  template <class E>
  E choice(const Key& key, E def) {
    std::vector<const char*> names;
    for (const auto& entry : SettingNames<E>::table) names.push_back(entry.first);
    E value = def;
    settingValue(oneOf(key, settingName(def), names), value);
    return value;
  }
  bool flag(const Key& key);                         // 1/true/yes/on or 0/false/no/off
  std::string text(const Key& key);                  // any text ("" when unset)
  std::string token(const Key& key, size_t maxLen);  // letters, digits, '-', '_' ("" when unset)
  bool isSet(const char* name) const;

 private:
  const char* get(const char* name) const;  // nullptr when unset, empty or recording
  Setting& record(const Key& key, Setting::Kind kind);  // a dummy when not recording
  void keep(const Key& key, std::string text);        // the value read, when keeping them
  std::vector<Setting>* table_ = nullptr;
  std::vector<SettingValue>* values_ = nullptr;
  Setting dummy_;
};

}  // namespace roce
