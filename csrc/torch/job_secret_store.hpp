// Where a process of a torch job gets the job secret (common/job_secret.hpp)
// before its first group forms: ROCE_PG_JOB_SECRET when the launcher sets
// it, else the job's store (the store torch was given, under no group's
// prefix), where the first process to look leaves 256 random bits and every
// later one, spares and restarted workers included, finds them. The store is
// trusted: whoever can read it can join the job anyway.
#pragma once
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace roce::adapter {

void ensureJobSecret(const c10::intrusive_ptr<c10d::Store>& store);

}  // namespace roce::adapter
