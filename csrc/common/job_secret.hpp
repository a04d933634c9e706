// The job's secret: what tells a connection from another rank of the job
// from one by anybody else who can reach a rank's listener. Every hello and
// join header (runtime/hello.hpp) carries a message authentication code of
// its bytes under it, and the front desk closes, unread, a connection whose
// code does not match. One per process (a process serves one job): the torch
// adapter adopts it before the process's first group forms, from
// ROCE_PG_JOB_SECRET or from the job's store, where the first process to
// look leaves 256 random bits for the others (torch/job_secret_store.cpp).
// Until one is adopted (the torch-free harnesses) the codes are computed
// under an empty key: the format is the same, nothing is protected.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace roce {

constexpr size_t kMacBytes = 16;  // HMAC-SHA256 truncated to 128 bits
using Mac = std::array<uint8_t, kMacBytes>;

class JobSecret {
 public:
  // Adopts `key` (non-empty), read from `source` (for errors). The same key
  // again is fine; another throws roce::Error(Invalid) naming both sources.
  static void adopt(const std::string& key, const std::string& source);
  static bool adopted();
  static std::string key();  // "" until adopted
  // The first kMacBytes of HMAC-SHA256 of the bytes under the secret.
  static Mac mac(const void* data, size_t len);
  // Whether `tag` is the bytes' MAC (compared in constant time).
  static bool verify(const void* data, size_t len, const uint8_t* tag);
};

}  // namespace roce
