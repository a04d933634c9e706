#include "job_secret.hpp"

#include <cstring>
#include <mutex>

#include "error.hpp"
#include "hmac.hpp"

namespace roce {
namespace {

std::mutex mu;
std::string secret;        // guarded by mu
std::string secretSource;  // likewise

}  // namespace

void JobSecret::adopt(const std::string& key, const std::string& source) {
  if (key.empty()) throwInvalid(str("the job secret from ", source, " is empty"));
  std::lock_guard<std::mutex> g(mu);
  if (secret.empty()) {
    secret = key;
    secretSource = source;
    return;
  }
  if (secret != key)
    throwInvalid(str("this process already holds another job secret (from ", secretSource, ") than the one from ",
                     source, ": a process serves one job. Set ROCE_PG_JOB_SECRET alike on every rank, or leave it "
                     "unset everywhere so that the job's store gives every rank the same one"));
}

bool JobSecret::adopted() {
  std::lock_guard<std::mutex> g(mu);
  return !secret.empty();
}

std::string JobSecret::key() {
  std::lock_guard<std::mutex> g(mu);
  return secret;
}

Mac JobSecret::mac(const void* data, size_t len) {
  const Sha256 full = hmacSha256(key(), data, len);
  Mac m;
  std::memcpy(m.data(), full.data(), m.size());
  return m;
}

bool JobSecret::verify(const void* data, size_t len, const uint8_t* tag) {
  const Mac expected = mac(data, len);
  uint8_t diff = 0;
  for (size_t i = 0; i < kMacBytes; ++i) diff |= static_cast<uint8_t>(expected[i] ^ tag[i]);
  return diff == 0;
}

}  // namespace roce
