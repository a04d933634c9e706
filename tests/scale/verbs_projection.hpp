// The memory the verbs transport would register on a rank with `peers`
// network connections: what "registered bytes" would be on an RDMA machine,
// projected here where there is none.
//
// Mirrors roce::verbsRegisteredBytes(const Config&, int peers), which main is
// adding in csrc/transport/verbs/verbs_connect.cpp together with the pooled
// buffers it describes; once that reaches this branch, call it instead. Until
// then the pool sizes come from the environment with main's defaults:
//   landing pool ROCE_PG_IB_POOL_BYTES (16 MiB) in slots of 64 + ROCE_PG_IB_SLOT_BYTES (64 KiB),
//   a staging pool of a quarter of it,
//   per peer qps x ((slots + 36) + max(128, 2 slots + 64)) control entries of 64 bytes,
//   qps = max(ROCE_PG_IB_QPS_PER_CONNECTION, channels), slots = ROCE_PG_IB_SLOTS.
#pragma once
#include <cstddef>

namespace roce {
struct Config;
}

namespace scale {

// `cfg`: the group's resolved configuration (Communicator::config(): channels known).
size_t projectedVerbsBytes(const roce::Config& cfg, int peers);

}  // namespace scale
