#include "hmac.hpp"

#include <dlfcn.h>

#include <cstdint>
#include <mutex>
#include <string>

#include "error.hpp"

namespace roce {
namespace {

// OpenSSL's one-shot HMAC and its SHA-256 digest, the same in 1.1 and 3.x.
using EvpSha256 = const void* (*)();
using Hmac = unsigned char* (*)(const void* md, const void* key, int keyLen, const unsigned char* data, size_t len,
                                unsigned char* out, unsigned int* outLen);

struct Crypto {
  EvpSha256 sha256 = nullptr;
  Hmac hmac = nullptr;
  std::string error;
};

// OPENSSL_init_crypto's flag that keeps libcrypto from freeing its state at
// exit: the runtime thread may still verify a head while the process ends.
constexpr uint64_t kOpensslInitNoAtexit = 0x00080000L;
using OpensslInit = int (*)(uint64_t opts, const void* settings);

const Crypto& crypto() {
  // Never freed, for the same reason.
  static Crypto* c = new Crypto;
  static std::once_flag once;
  std::call_once(once, [] {
    for (const char* name : {"libcrypto.so.3", "libcrypto.so.1.1", "libcrypto.so"}) {
      void* lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (!lib) continue;
      const auto sha256 = reinterpret_cast<EvpSha256>(dlsym(lib, "EVP_sha256"));
      const auto hmac = reinterpret_cast<Hmac>(dlsym(lib, "HMAC"));
      if (!sha256 || !hmac) continue;
      if (const auto init = reinterpret_cast<OpensslInit>(dlsym(lib, "OPENSSL_init_crypto")))
        init(kOpensslInitNoAtexit, nullptr);
      c->sha256 = sha256;
      c->hmac = hmac;
      return;
    }
    c->error = "roce: cannot load OpenSSL's libcrypto (libcrypto.so.3 or .so.1.1) for the job secret's "
               "message authentication: install libssl3 (Debian, Ubuntu) or openssl-libs (RHEL, Fedora)";
  });
  return *c;
}

}  // namespace

Sha256 hmacSha256(std::string_view key, const void* data, size_t len) {
  const Crypto& c = crypto();
  if (!c.hmac) throwInvalid(c.error.substr(6));
  Sha256 out{};
  unsigned int outLen = 0;
  static const unsigned char none = 0;  // HMAC wants a pointer even for an empty key
  const void* keyBytes = key.empty() ? static_cast<const void*>(&none) : key.data();
  if (!c.hmac(c.sha256(), keyBytes, static_cast<int>(key.size()),
              static_cast<const unsigned char*>(data), len, out.data(), &outLen) ||
      outLen != out.size())
    throwInvalid("HMAC-SHA256 from libcrypto failed");
  return out;
}

}  // namespace roce
