// torch's fault-tolerance API on a roce group (RoceBackend::reconfigure):
// the group takes the membership its handles name, formed as any group joins
// (GroupBuilder::join), through the group's store under keys of the uuid, so
// survivors and processes that just started meet alike and nothing of an
// earlier membership is read. What is per process stays: the runtime, its
// listener and links, the transports' devices and pools, the registrations.
#include <roce_torch_headers.hpp>  // first: a precompiled header (setup.py)
#include "backend.hpp"

#ifdef C10D_BACKEND_HAS_RECONFIGURE
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <variant>

#include "../group/group_builder.hpp"
#include "reconfigure_handles.hpp"
#include "store_bootstrap.hpp"

namespace roce::adapter {
using namespace roce::group;

c10d::ReconfigureHandle RoceBackend::get_reconfigure_handle() const {
  return formatReconfigureHandle({globalRank_, handleNonce_});
}

c10::intrusive_ptr<c10d::Work> RoceBackend::reconfigure(const c10d::ReconfigureOptions& opts) {
  const std::string own = get_reconfigure_handle();
  const bool ordered = std::holds_alternative<std::vector<c10d::ReconfigureHandle>>(opts.handles);
  std::vector<std::string> members;
  int newRank = -1;
  try {
    std::vector<std::string> listed;
    std::visit([&](const auto& handles) { listed.assign(handles.begin(), handles.end()); }, opts.handles);
    members = orderReconfigureHandles(std::move(listed), ordered, own, &newRank);
  } catch (const Error& e) {
    C10_THROW_ERROR(ValueError, e.what());
  }
  // Checked here and claimed in the store below: a reused uuid would find the
  // keys of the membership that used it.
  TORCH_CHECK_VALUE(std::find(usedUuids_.begin(), usedUuids_.end(), opts.uuid) == usedUuids_.end(),
                    "roce: reconfigure: uuid ", opts.uuid, " was used before on this group (rank ", getRank(),
                    "): pass a fresh uuid to every reconfigure");
  const std::chrono::milliseconds timeout = opts.timeout.value_or(timeout_);
  auto keys = c10::make_intrusive<c10d::PrefixStore>(str("roce/reconfigure/", opts.uuid), store_);
  if (newRank == 0) {
    const std::string claimedBy = keys->compareSet("claimed", "", own);
    TORCH_CHECK_VALUE(claimedBy == own, "roce: reconfigure: uuid ", opts.uuid, " was already used by the process of handle ",
                      claimedBy, " on this store: pass a fresh uuid to every reconfigure");
  }
  usedUuids_.push_back(opts.uuid);

  const std::string what = str("reconfigure(uuid=", opts.uuid, ")");
  if (engine_) {
    // The program asked for this: no abort hooks, and the old membership's
    // work in flight fails with this reason.
    stopping_ = true;
    engine_->abort(str(what, " replaced this group's membership of ", getSize(), " ranks"));
    engine_.reset();
    stopping_ = false;
  }
  callPeers_ = std::make_unique<CallPeers>();
  noMembersWhy_ = str(what, " did not complete");
  try {
    StoreBootstrap bs(keys);
    auto comm = GroupBuilder::join(bs, cfg_, newRank, static_cast<int>(members.size()), globalRank_, timeout);
    rank_ = newRank;
    size_ = static_cast<int>(members.size());
    collectives_ = 0;
    p2ps_ = 0;
    start(std::move(comm));
  } catch (const Error& e) {
    noMembersWhy_ = str(what, " failed (", e.what(), "); call reconfigure again with a fresh uuid");
    C10_THROW_ERROR(DistBackendError, e.what());
  }
  traceRanks_.clear();
  for (const auto& h : members) traceRanks_.push_back(parseReconfigureHandle(h).stableRank);
  auto work = c10::make_intrusive<RoceWork>(c10d::OpType::UNKNOWN, getRank(), "reconfigure", std::vector<at::Tensor>{});
  work->complete(nullptr);
  return work;
}

}  // namespace roce::adapter
#endif
