// The progress engine: one thread per process group that owns the group's
// Communicator and executes Tasks in the order they were issued. Collectives
// run to completion one after another; point-to-point tasks only post their
// request and are then polled alongside, so a receive waiting for a late send
// never blocks the operations queued behind it.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../common/backoff.hpp"
#include "../common/describable.hpp"
#include "timeout_extensions.hpp"
#include "trace.hpp"

namespace roce::comm {
class Communicator;
}
namespace roce::engine {
using namespace roce::comm;


class Task : public Describable {
 public:
  // Runs on the progress thread. Returns true when finished, false if it left
  // requests in flight that poll() will finish. Throws on failure.
  virtual bool start(Communicator& c) = 0;
  virtual bool poll(Communicator&) { return true; }
  // Called exactly once, on the progress thread (or by the destructor of the
  // engine for tasks that never ran), with null on success.
  virtual void complete(std::exception_ptr error) = 0;
  // describe() names the task for error messages ("allreduce #3 (4096 bytes)");
  // it is called only when a message needs it.

  // The task fails if it has not finished this long after it started running.
  std::chrono::milliseconds timeout{std::chrono::hours(24)};
  Clock::time_point deadline = Clock::time_point::max();  // set when it starts
  // The ephemeral timeout extensions whose expiry this task owns (released
  // when the Work completes, or when the task is dropped unrun).
  TimeoutExtensions::Claim timeoutExtension;

  // Its entry in the group's TraceRing (0: not recorded), and what the engine
  // learns while running it: when it started and ended (TraceRing::nowNs; set
  // before complete(), which hands them to the Work) and the algorithm used.
  uint64_t tracePos = 0;
  // Collectives: the group's sequence number and name (a string literal),
  // for the rank's OpProgress; 0 for point-to-point operations.
  uint64_t collectiveSeq = 0;
  const char* collectiveOp = nullptr;
  int64_t startNs = 0, endNs = 0;
  const char* algo = nullptr;
  // A task that serves peers for as long as something lives (a window's
  // service): it never finishes on its own, so shutdown() does not wait for
  // it, and its deadline is far away.
  bool serves = false;
};

class Engine {
 public:
  explicit Engine(std::unique_ptr<Communicator> comm);
  ~Engine();  // aborts whatever is left and joins the thread

  void enqueue(std::shared_ptr<Task> task);
  // True on any group's progress thread: a thread roce owns, whose state
  // (a device selected for good, say) no caller sees.
  static bool onProgressThread();
  // The engine whose progress thread this is (null elsewhere).
  static Engine* ofThisThread();
  // What stopping begins with, taking no lock a stopping thread holds: the
  // running operation is interrupted and the loop told to end. For the
  // engine's own thread while another thread stops (and joins) it.
  void requestStop(const std::string& why);
  // Runs `task` on the calling thread and completes it there, if nothing is
  // queued or in flight and the progress thread is parked (so the order of
  // operations is the order of calls, and the Communicator is never used by
  // two threads at once: the progress thread cannot start anything while the
  // caller holds the engine's mutex). Returns false, having done nothing, when
  // the task must be enqueued instead. Only for tasks whose start() finishes
  // them (collectives); the caller still owns the task afterwards. Other
  // threads issuing work on the group meanwhile wait for it (enqueue takes
  // the mutex); shutdown() gives it the grace period, then aborts it.
  bool runInline(Task& task);
  // Blocks until the progress thread sleeps with nothing queued or in flight
  // (the state in which runInline succeeds), or `timeout` passes; returns
  // whether it does. A call made right after a queued one completed can find
  // the thread not yet parked and queue instead of running inline: tests and
  // benchmarks that need the inline path wait for this state rather than hope.
  bool waitParked(std::chrono::milliseconds timeout);
  // Lets queued work finish for up to `grace`, then fails what is left.
  void shutdown(std::chrono::milliseconds grace);
  // Fails everything pending and stops at once.
  void abort(const std::string& why);
  // For statistics readable from any thread (Communicator::counters()).
  Communicator& comm() { return *comm_; }
  bool hasComm() const { return comm_ != nullptr; }  // false once shut down or aborted
  std::string stopReason();  // why it stopped (empty while it runs)
  // The group's flight recorder: callers record a task before issuing it
  // (Task::tracePos); the engine stamps its start, end and outcome.
  TraceRing& trace() { return trace_; }
  // Called once, on the thread that saw it, when the first operation fails in
  // a way that breaks the group (timeout, dead peer, abort; not a rejected
  // argument): the adapter dumps the trace there (ROCE_PG_TRACE_DUMP). Set
  // before any work is issued.
  std::function<void(const TraceRing&)> onFailure;

 private:
  using Finished = std::pair<std::shared_ptr<Task>, std::exception_ptr>;
  void loop();
  void runOne(const std::shared_ptr<Task>& t);
  // Runs t.start(); on failure leaves the communicator in the state fail()
  // describes and returns the error (null on success). Progress thread, or a
  // caller holding mu_ while the progress thread is parked.
  std::exception_ptr execute(Task& t, bool& finished, bool inlined);
  // Stamps t's end in the trace (failed with e's message, or completed);
  // `broke`: the failure broke the communicator (runs onFailure once).
  void recordEnd(Task& t, std::exception_ptr e, bool broke);
  // What a failure means for the communicator (see fail()).
  void settle(std::exception_ptr e);
  void pollInflight();  // the in-flight tasks and the services
  // Polls `tasks`, moving the finished ones (with their error, the
  // communicator already settled) to `done`; `locked`: mu_ is held.
  void takeFinished(std::vector<std::shared_ptr<Task>>& tasks, std::vector<Finished>& done, bool locked);
  // Parked with services: progresses them, then sleeps until the transports,
  // a connection or a wake-up has something (mu_ released meanwhile).
  void serveParked(std::unique_lock<std::mutex>& g);
  void completeQuietly(const std::shared_ptr<Task>& t, std::exception_ptr e);
  // The same with `broke` (whether the failure broke the communicator) read
  // already, for completions that run while a caller may hold comm_.
  void completeAs(const std::shared_ptr<Task>& t, std::exception_ptr e, bool broke);
  // Something below the tasks threw (a transport bug, out of memory): break
  // the communicator and fail every in-flight task instead of terminating.
  void failInflight(const std::string& why);
  void stopThread(const std::string& why);

  std::unique_ptr<Communicator> comm_;
  TraceRing trace_;  // outlives nothing it records: tasks hold positions, not pointers
  std::mutex mu_;
  std::condition_variable cv_;      // wakes the progress thread
  std::condition_variable idleCv_;  // tells shutdown() the queue drained
  std::deque<std::shared_ptr<Task>> queue_;
  std::vector<std::shared_ptr<Task>> inflight_;  // progress thread only
  // Tasks that serve peers (Task::serves): polled like inflight_, but the
  // thread parks beside them, so inline operations still run. Changed under
  // mu_ by the progress thread, which alone reads them without it.
  std::vector<std::shared_ptr<Task>> services_;
  // Tasks that finished inside an inline operation's waits (its idle hook),
  // under mu_; the progress thread completes them (serveParked).
  std::vector<Finished> finishedInline_;
  size_t inflightCount_ = 0;                     // under mu_, for shutdown()
  bool running_ = false;                         // a task is executing
  bool parked_ = false;                          // the progress thread sleeps with nothing to do
  std::atomic<bool> callerRunning_{false};       // runInline is executing (holding mu_)
  std::atomic<bool> failureReported_{false};     // onFailure ran
  bool stop_ = false;
  bool graceful_ = false;                        // shutdown() rather than abort()
  std::string stopReason_;
  // The progress thread stopped itself (an abort from a callback or hook
  // on it): it was detached and still owns comm_ until its loop returns,
  // which it says here (under mu_), so that a later stop or the destructor
  // waits for that before freeing what the loop uses.
  bool detached_ = false;
  bool loopEnded_ = false;
  std::thread::id loopThread_;  // the progress thread's id (it stays valid after a detach)
  std::condition_variable loopEndedCv_;
  std::thread thread_;
};

}  // namespace roce::engine
