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

#include <pybind11/pybind11.h>

#include <algorithm>
#include <optional>
#include <variant>

#include "../common/fnv.hpp"
#include "../common/hex.hpp"
#include "../group/group_builder.hpp"
#include "reconfigure_handles.hpp"
#include "store_bootstrap.hpp"
#include "trace_signal.hpp"

namespace roce::adapter {
using namespace roce::group;


c10d::ReconfigureHandle RoceBackend::get_reconfigure_handle() const {
  return formatReconfigureHandle({globalRank_, handleNonce_});
}

c10::intrusive_ptr<c10d::Work> RoceBackend::reconfigure(const c10d::ReconfigureOptions& opts) {
  TORCH_CHECK(!Engine::onProgressThread(), "roce: reconfigure was called on a roce progress thread (a Work's "
              "callback or an abort hook): call it from the program's own thread");
  TORCH_CHECK(!coalescing_.isOpen(), "roce: reconfigure inside a coalescing region (batch_isend_irecv, "
              "_coalescing_manager): end the region first");
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
  const std::string what = str("reconfigure(uuid=", opts.uuid, ")");
  // A reused uuid would find the keys of the membership that used it: each
  // member claims its place under the uuid, and a place another process
  // holds (or this process's earlier use) refuses the call before anything
  // of the current membership is touched.
  TORCH_CHECK_VALUE(std::find(usedUuids_.begin(), usedUuids_.end(), opts.uuid) == usedUuids_.end(), "roce: ", what,
                    " on rank ", getRank(), ": uuid ", opts.uuid,
                    " was used before on this group: pass a fresh uuid to every reconfigure");
  auto keys = c10::make_intrusive<c10d::PrefixStore>(str("roce/reconfigure/", opts.uuid), store_);
  // The membership as every member must see it (a set of handles is ordered
  // alike everywhere): the first member names it under the uuid, and a
  // member that passes another list, or a uuid an earlier membership of
  // other processes used, is refused here, with its own membership intact.
  // Compared by a digest: a list of 1,000 handles is ~50 KB, and each member
  // sending it would cost the store ~100 MB per reconfigure. The member at
  // position 0 stores the list itself, for the error of one that differs.
  std::string listed;
  for (const auto& h : members) listed += (listed.empty() ? "" : ", ") + h;
  const std::string digest = str(members.size(), ":", hex64(fnv1a64(listed)));
  const std::string named = keys->compareSet("members-digest", "", digest);
  if (named == digest && members.front() == own) keys->set("members", listed);
  if (named != digest) {
    const std::string theirs = keys->check({"members"})
                                   ? str("'s members are [", keys->get_to_str("members"), "]")
                                   : str("'s members have the digest ", named, " (their list is not stored yet)");
    TORCH_CHECK_VALUE(false, "roce: ", what, " on rank ", getRank(), ": uuid ", opts.uuid, theirs,
                      " (named by the member that came first), and this process passes [", listed,
                      "]: pass the same handles on every member, and a fresh uuid to every reconfigure");
  }
  const std::string claimedBy = keys->compareSet(str("claimed/", newRank), "", own);
  TORCH_CHECK_VALUE(claimedBy == own, "roce: ", what, ": uuid ", opts.uuid, " was already used on this store (rank ",
                    newRank, " of it was the process of handle ", claimedBy,
                    "): pass a fresh uuid to every reconfigure");
  usedUuids_.push_back(opts.uuid);
  const std::chrono::milliseconds timeout = opts.timeout.value_or(timeout_);

  uint64_t stopRequests;  // those that came before the old membership ended: not this one's
  {
    // The old membership ends: the neighbours are told why, its work in
    // flight fails naming the reconfigure, and no abort hook runs (the
    // program asked for it). Its trace is no longer dumped on a signal.
    std::lock_guard<std::mutex> g(engineMu_);
    const StoppingEngine mark(stoppingEngine_, engine_.get());
    stopRequests = stopRequests_;
    formingAborted_ = false;  // an abort before this call ended the old membership only
    if (traceSignalId_) TraceSignal::remove(traceSignalId_);
    traceSignalId_ = 0;
    if (engine_) {
      const std::string why = str(what, " replaced this group's membership of ", getSize(), " ranks");
      stopping_ = true;
      failWindows(str(why, ": register the window's tensor again"));
      if (engine_->hasComm()) engine_->comm().announceDeparture(why);
      engine_->abort(why);
      engine_.reset();
    }
    stopping_ = false;  // the new membership's, also after an abort() that came before this call
    callPeers_ = std::make_unique<CallPeers>();
    noMembersWhy_ = str(what, " is forming its membership");
  }
  std::unique_ptr<Communicator> comm;
  try {
    // The wait for the other members can be long: Python's other threads
    // (a watchdog that aborts the group among them) run meanwhile.
    std::optional<pybind11::gil_scoped_release> noGil;
    if (Py_IsInitialized() && PyGILState_Check()) noGil.emplace();
    StoreBootstrap bs(keys, &formingAborted_, "abort() or shutdown() was called on this process group while its "
                      "membership formed");
    comm = GroupBuilder::join(bs, cfg_, newRank, static_cast<int>(members.size()), globalRank_, timeout);
  } catch (const std::exception& e) {
    std::string cause = e.what();
    if (cause.rfind("roce: ", 0) == 0) cause.erase(0, 6);
    // The ranks the cause names are positions in the handle list, and the
    // timeout it means is this call's: say which processes they are.
    std::string positions;
    for (size_t i = 0; i < members.size() && i < 16; ++i)
      positions += str(i ? ", " : "", i, " = stable rank ", parseReconfigureHandle(members[i]).stableRank);
    if (members.size() > 16) positions += ", ...";
    const std::string why = str(what, " failed on rank ", newRank, " of ", members.size(), ": ", cause,
                                " (ranks here are positions in the members' handles: ", positions,
                                "; the timeout is reconfigure's, ", timeout.count(), " ms)");
    {
      std::lock_guard<std::mutex> g(engineMu_);
      noMembersWhy_ = str(why, "; call reconfigure again with a fresh uuid");
    }
    C10_THROW_ERROR(DistBackendError, str("roce: ", why, ". The group has no members until a reconfigure "
                                          "succeeds: call it again with a fresh uuid"));
  }
  std::lock_guard<std::mutex> g(engineMu_);
  rank_ = newRank;
  size_ = static_cast<int>(members.size());
  membershipUuid_ = opts.uuid;
  membershipStore_ = keys;
  collectives_ = 0;
  p2ps_ = 0;
  monitoredBarriers_ = 0;
  shrinks_ = 0;
  windows_ = 0;
  windowRegistrations_ = 0;
  traceRanks_.clear();
  for (const auto& h : members) traceRanks_.push_back(parseReconfigureHandle(h).stableRank);
  start(std::move(comm));
  // abort() or shutdown() came while the membership formed: it ends too.
  if (stopRequests_ != stopRequests) {
    const StoppingEngine mark(stoppingEngine_, engine_.get());
    stopping_ = true;
    engine_->abort(str("abort() or shutdown() was called on this process group during ", what));
  }
  auto work = c10::make_intrusive<RoceWork>(c10d::OpType::UNKNOWN, getRank(), "reconfigure", std::vector<at::Tensor>{});
  work->complete(nullptr);
  return work;
}

}  // namespace roce::adapter
#endif
