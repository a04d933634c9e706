#include <roce_torch_headers.hpp>  // first: a precompiled header (setup.py)
#include "job_secret_store.hpp"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <cstdio>
#include <cstdlib>

#include "../common/error.hpp"
#include "../common/job_secret.hpp"
#include "../common/random.hpp"

namespace roce::adapter {
namespace {

constexpr const char* kSecretKey = "roce/job_secret";

std::string randomSecret() {
  std::string hex;
  for (int i = 0; i < 4; ++i) {
    char part[17];
    std::snprintf(part, sizeof part, "%016llx", static_cast<unsigned long long>(randomNonce()));
    hex += part;
  }
  return hex;
}

}  // namespace

void ensureJobSecret(const c10::intrusive_ptr<c10d::Store>& store) {
  if (const char* env = std::getenv("ROCE_PG_JOB_SECRET"); env && *env) {
    JobSecret::adopt(env, "ROCE_PG_JOB_SECRET");
    return;
  }
  if (JobSecret::adopted()) return;  // from this job's store, at the process's first group
  c10::intrusive_ptr<c10d::Store> job = store;
  while (auto* prefixed = dynamic_cast<c10d::PrefixStore*>(job.get())) job = prefixed->getUnderlyingStore();
  // The first offer stays; every process adopts what the key holds.
  const std::string secret = job->compareSet(kSecretKey, "", randomSecret());
  JobSecret::adopt(secret, "the job's store (key roce/job_secret)");
}

}  // namespace roce::adapter
