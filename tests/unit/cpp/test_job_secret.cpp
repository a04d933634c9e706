// The job secret's message authentication (csrc/common/job_secret.hpp,
// csrc/common/hmac.hpp): HMAC-SHA256 from libcrypto against RFC 4231's
// published values, the MAC a hello carries, and a process holding one
// secret for good.
#include <cstdint>
#include <string>

#include "common/error.hpp"
#include "common/hmac.hpp"
#include "common/job_secret.hpp"
#include "roce_check.hpp"

namespace {

std::string hex(const uint8_t* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) s += {digits[p[i] >> 4], digits[p[i] & 15]};
  return s;
}

}  // namespace

TEST(hmac_sha256_matches_rfc_4231) {
  const std::string jefe = "what do ya want for nothing?";
  const roce::Sha256 case2 = roce::hmacSha256("Jefe", jefe.data(), jefe.size());
  CHECK_EQ(hex(case2.data(), case2.size()), "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  const std::string key1(20, '\x0b'), hi = "Hi There";
  const roce::Sha256 case1 = roce::hmacSha256(key1, hi.data(), hi.size());
  CHECK_EQ(hex(case1.data(), case1.size()), "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
}

TEST(a_process_signs_with_its_one_secret) {
  // In order: what a process does before and after it adopts its secret.
  const std::string head = "a hello's 32 bytes, or any bytes";
  CHECK(!roce::JobSecret::adopted());
  const roce::Sha256 unkeyed = roce::hmacSha256("", head.data(), head.size());
  const roce::Mac before = roce::JobSecret::mac(head.data(), head.size());
  CHECK_EQ(hex(before.data(), before.size()), hex(unkeyed.data(), roce::kMacBytes));

  roce::JobSecret::adopt("s3cret", "the test");
  roce::JobSecret::adopt("s3cret", "the test again");  // the same one: fine
  CHECK_THROWS(roce::Error, roce::JobSecret::adopt("another", "ROCE_PG_JOB_SECRET"),
               "already holds another job secret (from the test) than the one from ROCE_PG_JOB_SECRET");
  CHECK_EQ(roce::JobSecret::key(), std::string("s3cret"));

  const roce::Sha256 keyed = roce::hmacSha256("s3cret", head.data(), head.size());
  roce::Mac tag = roce::JobSecret::mac(head.data(), head.size());
  CHECK_EQ(hex(tag.data(), tag.size()), hex(keyed.data(), roce::kMacBytes));
  CHECK(roce::JobSecret::verify(head.data(), head.size(), tag.data()));
  for (size_t bit = 0; bit < 8 * roce::kMacBytes; bit += 13) {
    roce::Mac flipped = tag;
    flipped[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    CHECK(!roce::JobSecret::verify(head.data(), head.size(), flipped.data()));
  }
  CHECK(!roce::JobSecret::verify(head.data(), head.size() - 1, tag.data()));  // another head
  CHECK(!roce::JobSecret::verify(head.data(), head.size(), before.data()));    // the unkeyed code
}
