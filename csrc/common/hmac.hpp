// HMAC-SHA256 from the system's OpenSSL libcrypto (libcrypto.so.3, or 1.1),
// loaded when first used: the job secret's message authentication codes
// (job_secret.hpp) need a maintained implementation, and loading it at run
// time keeps OpenSSL's headers out of the build (machines that build roce
// need nothing more; every Linux distribution ships libcrypto).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace roce {

using Sha256 = std::array<uint8_t, 32>;

// Throws roce::Error(Invalid) naming the library to install when libcrypto
// cannot be loaded.
Sha256 hmacSha256(std::string_view key, const void* data, size_t len);

}  // namespace roce
