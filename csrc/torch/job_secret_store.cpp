#include <roce_torch_headers.hpp>  // first: a precompiled header (setup.py)
#include "job_secret_store.hpp"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <cstdlib>

#include "../common/error.hpp"
#include "../common/hex.hpp"
#include "../common/job_secret.hpp"
#include "../common/random.hpp"

namespace roce::adapter {
namespace {

constexpr const char* kSecretKey = "roce/job_secret";

std::string randomSecret() {
  std::string hex;
  for (int i = 0; i < 4; ++i) hex += hex64Padded(randomNonce());
  return hex;
}

// The secret the job's store holds, `offer` left there if none: a
// compare-and-set, or, for a store without one, an election by add().
std::string secretInStore(c10d::Store& job, const std::string& offer) {
  try {
    return job.compareSet(kSecretKey, "", offer);
  } catch (const c10::NotImplementedError&) {
  }
  if (job.add(str(kSecretKey, "/offers"), 1) == 1) job.set(kSecretKey, offer);
  job.wait({kSecretKey});
  return job.get_to_str(kSecretKey);
}

}  // namespace

void ensureJobSecret(const c10::intrusive_ptr<c10d::Store>& store) {
  // libcrypto is loaded here, on the caller's thread: a machine without it
  // fails the group's creation saying what to install.
  (void)JobSecret::mac("", 0);
  if (const char* env = std::getenv("ROCE_PG_JOB_SECRET"); env && *env) {
    JobSecret::adopt(env, "ROCE_PG_JOB_SECRET");
    return;
  }
  c10::intrusive_ptr<c10d::Store> job = store;
  while (auto* prefixed = dynamic_cast<c10d::PrefixStore*>(job.get())) job = prefixed->getUnderlyingStore();
  // The first offer stays; every process adopts what the key holds. A
  // process that holds one already offers it, so a store it meets later
  // (another job's, a restart's fresh one) agrees with it or fails here.
  const std::string mine = JobSecret::adopted() ? JobSecret::key() : randomSecret();
  const std::string secret = secretInStore(*job, mine);
  if (JobSecret::adopted() && secret != mine)
    throwInvalid("this group's store holds another job secret than the one this process adopted from an earlier "
                 "store (key roce/job_secret): its groups' ranks could not connect. Set ROCE_PG_JOB_SECRET alike "
                 "on every rank of the job");
  JobSecret::adopt(secret, "the job's store (key roce/job_secret)");
}

}  // namespace roce::adapter
