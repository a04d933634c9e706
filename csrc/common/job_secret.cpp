#include "job_secret.hpp"

#include <cstring>
#include <mutex>

#include "error.hpp"
#include "hmac.hpp"

namespace roce {
namespace {

// Never freed: the runtime thread may verify a head while the process exits.
struct State {
  std::mutex mu;
  std::string secret;        // guarded by mu
  std::string secretSource;  // likewise
};
State& state() {
  static State* s = new State;
  return *s;
}

}  // namespace

void JobSecret::adopt(const std::string& key, const std::string& source) {
  if (key.empty()) throwInvalid(str("the job secret from ", source, " is empty"));
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  if (s.secret.empty()) {
    s.secret = key;
    s.secretSource = source;
    return;
  }
  if (s.secret != key)
    throwInvalid(str("this process already holds another job secret (from ", s.secretSource, ") than the one from ",
                     source, ": a process serves one job. Set ROCE_PG_JOB_SECRET alike on every rank, or leave it "
                     "unset everywhere so that the job's store gives every rank the same one"));
}

bool JobSecret::adopted() {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  return !s.secret.empty();
}

std::string JobSecret::key() {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  return s.secret;
}

Mac JobSecret::mac(const void* data, size_t len) {
  const Sha256 full = hmacSha256(key(), data, len);
  Mac m;
  std::memcpy(m.data(), full.data(), m.size());
  return m;
}

bool JobSecret::verify(const void* data, size_t len, const uint8_t* tag) {
  Mac expected;
  try {
    expected = mac(data, len);
  } catch (const Error&) {
    return false;  // no libcrypto: nothing can be verified (called on the runtime thread, which must not throw)
  }
  uint8_t diff = 0;
  for (size_t i = 0; i < kMacBytes; ++i) diff |= static_cast<uint8_t>(expected[i] ^ tag[i]);
  return diff == 0;
}

}  // namespace roce
