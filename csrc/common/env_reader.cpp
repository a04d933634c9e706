#include "env_reader.hpp"

#include <cctype>
#include <climits>
#include <charconv>
#include <cstdlib>

#include "error.hpp"

namespace roce {

const char* scopeName(Scope s) {
  switch (s) {
    case Scope::Rank: return "rank";
    case Scope::Group: return "group";
    case Scope::Advised: return "advised";
    case Scope::Machine: return "machine";
  }
  return "?";
}

const char* EnvReader::get(const char* name) const {
  if (table_) return nullptr;
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

bool EnvReader::isSet(const char* name) const { return get(name) != nullptr; }

Setting& EnvReader::record(const Key& key, Setting::Kind kind) {
  if (!table_) return dummy_;
  Setting s{key.name, kind};
  s.layer = key.layer, s.scope = key.scope, s.placement = key.placement;
  table_->push_back(std::move(s));
  return table_->back();
}

void EnvReader::keep(const Key& key, std::string text) {
  if (!values_) return;
  if (key.unsetIsAuto && !isSet(key.name)) text = "auto";
  values_->push_back(SettingValue{key.name, key.scope, key.placement, std::move(text)});
}

namespace {

// strtoll base 0 with a K/M/G binary suffix ("4M"), in [lo, hi]; a value the
// suffix would overflow is out of range, not wrapped into it.
long long parseInteger(const char* name, const char* v, long long lo, long long hi) {
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 0);
  int shift = 0;
  if (end && (*end == 'k' || *end == 'K')) shift = 10, ++end;
  else if (end && (*end == 'm' || *end == 'M')) shift = 20, ++end;
  else if (end && (*end == 'g' || *end == 'G')) shift = 30, ++end;
  const bool fits = x <= (LLONG_MAX >> shift) && x >= (LLONG_MIN >> shift);
  if (fits) x *= 1ll << shift;
  if (!end || *end != '\0' || !fits || x < lo || x > hi)
    throwInvalid(str(name, "='", v, "' is not an integer in [", lo, ", ", hi, "]"));
  return x;
}

}  // namespace

long long EnvReader::integer(const Key& key, long long def, long long lo, long long hi) {
  Setting& s = record(key, Setting::Kind::Integer);
  s.lo = lo, s.hi = hi;
  const char* v = get(key.name);
  const long long x = v ? parseInteger(key.name, v, lo, hi) : def;
  keep(key, std::to_string(x));
  return x;
}

long long EnvReader::integerOrZero(const Key& key, long long def, long long lo, long long hi, const char* why) {
  Setting& s = record(key, Setting::Kind::Integer);
  s.lo = lo, s.hi = hi, s.zeroOk = true;
  const char* v = get(key.name);
  const long long x = v ? parseInteger(key.name, v, 0, hi) : def;
  if (x != 0 && x < lo) throwInvalid(str(key.name, "=", x, ": ", why));
  keep(key, std::to_string(x));
  return x;
}

double EnvReader::number(const Key& key, double def, double lo, double hi) {
  Setting& s = record(key, Setting::Kind::Number);
  s.numberLo = lo, s.numberHi = hi;
  const char* v = get(key.name);
  double x = def;
  if (v) {
    char* end = nullptr;
    x = std::strtod(v, &end);
    if (!end || *end != '\0' || !(x >= lo && x <= hi))
      throwInvalid(str(key.name, "='", v, "' is not a number in [", lo, ", ", hi, "]"));
  }
  char buf[32];  // the shortest text that reads back as exactly x
  keep(key, std::string(buf, std::to_chars(buf, buf + sizeof(buf), x).ptr));
  return x;
}

std::string EnvReader::oneOf(const Key& key, const std::string& def, const std::vector<const char*>& allowed) {
  Setting& s = record(key, Setting::Kind::Choice);
  s.choices.assign(allowed.begin(), allowed.end());
  const char* v = get(key.name);
  if (!v) {
    keep(key, def);
    return def;
  }
  std::string list;
  for (const char* a : allowed) {
    if (v == std::string(a)) {
      keep(key, v);
      return v;
    }
    list += str(list.empty() ? "" : ", ", a);
  }
  throwInvalid(str(key.name, "='", v, "': expected one of ", list));
}

bool EnvReader::flag(const Key& key) {
  record(key, Setting::Kind::Flag);
  const char* v = get(key.name);
  bool on = false;
  if (v) {
    const std::string s(v);
    if (s == "1" || s == "true" || s == "yes" || s == "on") on = true;
    else if (!(s == "0" || s == "false" || s == "no" || s == "off"))
      throwInvalid(str(key.name, "='", v, "': use 1 or 0"));
  }
  keep(key, on ? "1" : "0");
  return on;
}

std::string EnvReader::text(const Key& key) {
  record(key, Setting::Kind::Text);
  const char* v = get(key.name);
  keep(key, v ? v : "");
  return v ? v : "";
}

std::string EnvReader::token(const Key& key, size_t maxLen) {
  record(key, Setting::Kind::Token).hi = static_cast<long long>(maxLen);
  const char* v = get(key.name);
  const std::string t = v ? v : "";
  bool ok = t.size() <= maxLen;
  for (char ch : t) ok &= std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_';
  if (!ok) throwInvalid(str(key.name, "='", t, "': use up to ", maxLen, " letters, digits, '-' or '_'"));
  keep(key, t);
  return t;
}

}  // namespace roce
