#include "env_reader.hpp"

#include <cctype>
#include <climits>
#include <cstdlib>

#include "error.hpp"

namespace roce {

const char* EnvReader::get(const char* name) const {
  if (table_) return nullptr;
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

bool EnvReader::isSet(const char* name) const { return get(name) != nullptr; }

Setting& EnvReader::record(const char* name, Setting::Kind kind) {
  if (!table_) return dummy_;
  table_->push_back(Setting{name, kind});
  return table_->back();
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

long long EnvReader::integer(const char* name, long long def, long long lo, long long hi) {
  Setting& s = record(name, Setting::Kind::Integer);
  s.lo = lo, s.hi = hi;
  const char* v = get(name);
  return v ? parseInteger(name, v, lo, hi) : def;
}

long long EnvReader::integerOrZero(const char* name, long long def, long long lo, long long hi, const char* why) {
  Setting& s = record(name, Setting::Kind::Integer);
  s.lo = lo, s.hi = hi, s.zeroOk = true;
  const char* v = get(name);
  if (!v) return def;
  const long long x = parseInteger(name, v, 0, hi);
  if (x != 0 && x < lo) throwInvalid(str(name, "=", x, ": ", why));
  return x;
}

double EnvReader::number(const char* name, double def, double lo, double hi) {
  Setting& s = record(name, Setting::Kind::Number);
  s.numberLo = lo, s.numberHi = hi;
  const char* v = get(name);
  if (!v) return def;
  char* end = nullptr;
  const double x = std::strtod(v, &end);
  if (!end || *end != '\0' || !(x >= lo && x <= hi))
    throwInvalid(str(name, "='", v, "' is not a number in [", lo, ", ", hi, "]"));
  return x;
}

std::string EnvReader::oneOf(const char* name, const std::string& def, const std::vector<const char*>& allowed) {
  Setting& s = record(name, Setting::Kind::Choice);
  s.choices.assign(allowed.begin(), allowed.end());
  const char* v = get(name);
  if (!v) return def;
  std::string list;
  for (const char* a : allowed) {
    if (v == std::string(a)) return v;
    list += str(list.empty() ? "" : ", ", a);
  }
  throwInvalid(str(name, "='", v, "': expected one of ", list));
}

bool EnvReader::flag(const char* name) {
  record(name, Setting::Kind::Flag);
  const char* v = get(name);
  if (!v) return false;
  std::string s(v);
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off") return false;
  throwInvalid(str(name, "='", v, "': use 1 or 0"));
}

std::string EnvReader::text(const char* name) {
  record(name, Setting::Kind::Text);
  const char* v = get(name);
  return v ? v : "";
}

std::string EnvReader::token(const char* name, size_t maxLen) {
  record(name, Setting::Kind::Token).hi = static_cast<long long>(maxLen);
  const char* v = get(name);
  if (!v) return "";
  const std::string t = v;
  bool ok = t.size() <= maxLen;
  for (char ch : t) ok &= std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_';
  if (!ok) throwInvalid(str(name, "='", t, "': use up to ", maxLen, " letters, digits, '-' or '_'"));
  return t;
}

}  // namespace roce
