#include "engine.hpp"

#include <pthread.h>

#include <cstdint>

#include "../comm/communicator.hpp"
#include "../common/error.hpp"
#include "../common/log.hpp"

namespace roce::engine {
using namespace roce::comm;

namespace {

thread_local Engine* threadEngine = nullptr;  // the engine whose progress thread this is (null elsewhere)

// What a failed operation's trace entry says: the error's message.
std::string reasonOf(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& err) {
    return err.what();
  } catch (...) {
  }
  return "unknown error";
}

}  // namespace

Engine::Engine(std::unique_ptr<Communicator> comm)
    : comm_(std::move(comm)), trace_(comm_->config().trace.entries) {
  comm_->idleHook = [this] { pollInflight(); };
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "roce-progress");  // top -H, py-spy, tests (roce's threads' CPU time)
    threadEngine = this;
    loop();
    // Notified under the lock: a waiter may free this engine once it has it.
    std::lock_guard<std::mutex> g(mu_);
    loopEnded_ = true;
    loopEndedCv_.notify_all();
  });
  loopThread_ = thread_.get_id();
}

Engine::~Engine() {
  stopThread("the process group was destroyed");
  // A detached loop (it stopped itself) still uses this engine until it
  // returns: the destructor waits for that, off the lock of whoever called
  // the abort. Destroying the engine on its own progress thread (the last
  // reference dropped in a callback) cannot wait for itself.
  std::unique_lock<std::mutex> g(mu_);
  if (detached_ && std::this_thread::get_id() != loopThread_) loopEndedCv_.wait(g, [&] { return loopEnded_; });
  g.unlock();
  if (comm_ && graceful_) comm_->leaveGracefully();
  comm_.reset();
}

std::string Engine::stopReason() {
  std::lock_guard<std::mutex> g(mu_);
  return stopReason_;
}

void Engine::enqueue(std::shared_ptr<Task> task) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (stop_) {
      auto err = std::make_exception_ptr(
          Error(ErrorKind::Aborted, str("roce: ", task->describe(), " issued after the process group was shut down: ", stopReason_)));
      recordEnd(*task, err, /*broke=*/false);  // reported when the group stopped
      task->complete(err);
      return;
    }
    queue_.push_back(std::move(task));
    // The progress thread may be blocked on its transports with async work in
    // flight, or idle, answering connections (under mu_: comm_ lives while
    // stop_ is false).
    comm_->wake();
    comm_->wakeIdle();
  }
  cv_.notify_one();
}

void Engine::settle(std::exception_ptr e) {
  // Anything but an argument rejected before communication leaves peers'
  // message streams in an unknown state: the communicator refuses further work
  // from now on, and its transports drop every request they still hold.
  bool invalid = false;
  std::string why = "unknown error";
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    invalid = err.kind() == ErrorKind::Invalid;
    why = err.what();
    if (err.kind() == ErrorKind::Aborted) comm_->breakWith(why, /*tellPeers=*/false);
  } catch (const std::exception& err) {
    why = err.what();
  } catch (...) {
  }
  // An "invalid" error thrown after requests were posted is not harmless:
  // those requests must not outlive this task in a transport.
  if (!invalid || comm_->hasPendingRequests()) comm_->breakWith(why);
}

void Engine::recordEnd(Task& t, std::exception_ptr e, bool broke) {
  t.endNs = TraceRing::nowNs();
  if (t.collectiveSeq && comm_) {  // none: issued after the group stopped
    comm_->opProgress().ended(t.collectiveSeq, t.collectiveOp);
    if (t.startNs > 0 && t.endNs > t.startNs) {
      Counters::add(comm_->counters().collectiveNs, static_cast<uint64_t>(t.endNs - t.startNs));
      Counters::add(comm_->counters().collectivesTimed, 1);
    }
  }
  if (!e) {
    trace_.finished(t.tracePos, t.endNs, t.algo, nullptr);
    return;
  }
  if (t.tracePos) {
    const std::string why = reasonOf(e);  // failures only: the one allocation
    trace_.finished(t.tracePos, t.endNs, t.algo, &why);
  }
  if (broke && onFailure && !failureReported_.exchange(true)) {
    try {
      onFailure(trace_);
    } catch (const std::exception& err) {
      ROCE_WARN("reporting the failure of ", t.describe(), " raised: ", err.what());
    } catch (...) {
    }
  }
}

void Engine::completeQuietly(const std::shared_ptr<Task>& t, std::exception_ptr e) {
  // Progress thread (or the destructor, the thread joined): comm_ is ours.
  completeAs(t, e, e && !comm_->brokenReason().empty());
}

void Engine::completeAs(const std::shared_ptr<Task>& t, std::exception_ptr e, bool broke) {
  recordEnd(*t, e, broke);
  // complete() runs user-visible callbacks (futures); nothing may escape the
  // progress thread, or the process would terminate.
  try {
    t->complete(e);
  } catch (const std::exception& err) {
    ROCE_WARN("completing ", t->describe(), " raised: ", err.what());
  } catch (...) {
    ROCE_WARN("completing ", t->describe(), " raised an unknown exception");
  }
}

std::exception_ptr Engine::execute(Task& t, bool& finished, bool inlined) {
  std::exception_ptr err;
  try {
    const auto now = Clock::now();  // steady_clock: CLOCK_MONOTONIC, the trace's clock
    t.deadline = now + t.timeout;
    t.startNs = std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
    trace_.started(t.tracePos, t.startNs, inlined);
    if (t.collectiveSeq) comm_->opProgress().started(t.collectiveSeq, t.collectiveOp);
    comm_->algorithmState().last = nullptr;
    comm_->beginOperation(t, t.deadline);
    finished = t.start(*comm_);
    // A collective returns only after all its requests finished; if one did
    // not, its buffers could still be written after the caller sees success.
    if (comm_->hasPendingRequests())
      throwComm(str("internal error: ", t.describe(), " returned with requests still in flight"));
  } catch (...) {
    err = std::current_exception();
  }
  t.algo = comm_->algorithmState().last;  // also for a failed one: which algorithm failed
  comm_->endOperation();  // `t` may go away; the communicator must not name it later
  if (err) settle(err);
  return err;
}

bool Engine::runInline(Task& t) {
  std::exception_ptr err;
  bool broke = false;
  {
    std::lock_guard<std::mutex> g(mu_);
    // parked_ implies inflight_ is empty and the progress thread is inside
    // cv_.wait(): it cannot return from there while we hold mu_.
    if (stop_ || !parked_ || !queue_.empty()) return false;
    bool finished = false;
    // A parked thread serving peers (serveParked) sleeps on the transports
    // it prepared: end that wait here, so the transports see one waiter at
    // a time, and wake it afterwards to look at what this operation moved.
    comm_->endIdleWait();
    callerRunning_.store(true);
    err = execute(t, finished, /*inlined=*/true);
    callerRunning_.store(false);
    if (!services_.empty() || !finishedInline_.empty()) comm_->wakeIdle();
    if (!err && !finished) {
      // Only collectives come here, and they finish in start(); anything else
      // would need the progress thread to poll it.
      err = std::make_exception_ptr(Error(ErrorKind::Comm, str("roce: internal error: ", t.describe(),
                                                              " was run inline but left work in flight")));
      comm_->breakWith("an inline operation left work in flight");
    }
    broke = err && !comm_->brokenReason().empty();  // under mu_: the communicator is ours
  }
  recordEnd(t, err, broke);
  // Outside the lock: completing runs future callbacks, which may issue more work.
  if (err) {
    try {
      t.complete(err);
    } catch (...) {
    }
  } else {
    t.complete(nullptr);
  }
  return true;
}

bool Engine::waitParked(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> g(mu_);
  // idleCv_ is notified, under mu_, right before the thread sets parked_.
  return idleCv_.wait_for(g, timeout, [&] { return stop_ || (parked_ && queue_.empty()); }) && !stop_;
}

bool Engine::onProgressThread() { return threadEngine != nullptr; }

Engine* Engine::ofThisThread() { return threadEngine; }

void Engine::serveParked(std::unique_lock<std::mutex>& g) {
  // Under mu_ whenever comm_ is used: no inline operation runs meanwhile.
  // Completions (user callbacks, which may issue work) run without it, with
  // what they need of comm_ read before.
  std::vector<Finished> done;
  done.swap(finishedInline_);
  bool sleep = done.empty();
  bool announced = false;
  try {
    if (sleep) {
      comm_->progress();
      takeFinished(services_, done, /*locked=*/true);
      if (!services_.empty()) comm_->checkHealth();  // a departed peer fails what is served for it
      sleep = done.empty() && !services_.empty();
    }
    if (sleep) {
      comm_->announceIdle(/*transports=*/true);
      announced = true;
      // What arrived before the transports armed their notifications raises
      // no event: look once more before sleeping.
      const bool moved = comm_->progress();
      g.unlock();
      comm_->waitIdle(/*sleep=*/!moved);
      announced = false;
      g.lock();
      comm_->endIdleWait();
      if (!stop_) comm_->serveConnections();
      return;
    }
  } catch (...) {
    const std::string why = str("roce: serving peers failed: ", reasonOf(std::current_exception()));
    if (announced) comm_->waitIdle(/*sleep=*/false);  // withdraws the announcement
    comm_->endIdleWait();
    comm_->breakWith(why);
    auto err = std::make_exception_ptr(Error(ErrorKind::Comm, why));
    for (auto& t : services_) done.emplace_back(t, err);
    services_.clear();
  }
  const bool broke = !comm_->brokenReason().empty();
  g.unlock();
  for (auto& [t, err] : done) completeAs(t, err, err && broke);
  g.lock();
}

void Engine::runOne(const std::shared_ptr<Task>& t) {
  bool finished = false;
  if (std::exception_ptr err = execute(*t, finished, /*inlined=*/false)) {
    completeQuietly(t, err);
    return;
  }
  if (finished) completeQuietly(t, nullptr);
  else if (t->serves) {
    std::lock_guard<std::mutex> g(mu_);
    services_.push_back(t);
  } else {
    inflight_.push_back(t);
    std::lock_guard<std::mutex> g(mu_);
    ++inflightCount_;
  }
}

void Engine::pollInflight() {
  // From the idle hook of a collective run inline, a caller's thread holds
  // mu_ (and inflight_ is empty: the thread parks only without it). What
  // finishes there is completed by the progress thread, without mu_.
  const bool inlined = threadEngine == nullptr;
  std::vector<Finished> done;
  takeFinished(inflight_, done, inlined);
  takeFinished(services_, done, inlined);
  if (inlined) {
    finishedInline_.insert(finishedInline_.end(), done.begin(), done.end());
    return;
  }
  for (auto& [t, err] : done) completeQuietly(t, err);
}

void Engine::takeFinished(std::vector<std::shared_ptr<Task>>& tasks, std::vector<Finished>& done, bool locked) {
  for (size_t i = 0; i < tasks.size();) {
    auto t = tasks[i];
    bool finished = false;
    std::exception_ptr err;
    try {
      finished = t->poll(*comm_);
      if (!finished) comm_->checkTaskDeadline(t->describe(), t->deadline, t->timeout);
    } catch (...) {
      err = std::current_exception();
    }
    if (!finished && !err) { ++i; continue; }
    {
      std::unique_lock<std::mutex> g(mu_, std::defer_lock);
      if (!locked) g.lock();
      tasks.erase(tasks.begin() + static_cast<long>(i));
      if (!t->serves) --inflightCount_;
    }
    if (err) settle(err);
    done.emplace_back(t, err);
    // A failure may have failed other in-flight requests: rescan from the start.
    i = 0;
  }
}

void Engine::loop() {
  Communicator::IdleWait idle;
  auto workQueued = [this] {
    std::lock_guard<std::mutex> g(mu_);
    return stop_ || !queue_.empty();
  };
  for (;;) {
    std::shared_ptr<Task> next;
    {
      std::unique_lock<std::mutex> g(mu_);
      if (queue_.empty() && inflight_.empty()) {
        idleCv_.notify_all();
        // Nothing to progress: sleep until work arrives (brief spin first would
        // only burn a core another rank may need).
        parked_ = true;  // callers may now run small collectives inline (runInline)
        while (!stop_ && queue_.empty()) {
          if (!services_.empty() || !finishedInline_.empty()) {
            serveParked(g);
            continue;
          }
          if (!comm_->answersConnections()) {
            cv_.wait(g, [&] { return stop_ || !queue_.empty(); });
            break;
          }
          // Peers connect when they first need this rank: answer them while
          // idle, or a peer's first message would wait for this rank's next
          // operation. comm_ is touched only under mu_ (an inline operation
          // holds it while it runs).
          comm_->announceIdle(/*transports=*/false);
          g.unlock();
          comm_->waitIdle();
          g.lock();
          if (!stop_) comm_->serveConnections();
        }
        parked_ = false;
      }
      if (stop_) break;
      if (!queue_.empty()) {
        next = std::move(queue_.front());
        queue_.pop_front();
        running_ = true;
      }
    }
    if (next) {
      runOne(next);
      {
        std::lock_guard<std::mutex> g(mu_);
        running_ = false;
      }
      idle.moved();
    }
    if (!inflight_.empty()) {
      try {
        const bool moved = comm_->progress();
        pollInflight();
        if (!inflight_.empty()) comm_->checkHealth();
        // Inside the try: the idle wait re-checks by progressing too, and a
        // throw there (a dial failing with EMFILE) must fail the pending work,
        // not end the process in std::terminate.
        if (moved) idle.moved();
        else if (!next && !inflight_.empty()) comm_->idleRound(idle, workQueued);
      } catch (const Error& e) {
        failInflight(e.what());  // a peer failed while only asynchronous work was pending
      } catch (const std::exception& e) {
        failInflight(str("roce: the progress engine failed: ", e.what()));
      } catch (...) {
        failInflight("roce: the progress engine failed with an unknown exception");
      }
    }
  }
  // Stopping: fail what is left.
  const std::string why = stopReason_;
  comm_->breakWith(why, /*tellPeers=*/false);
  auto err = std::make_exception_ptr(Error(ErrorKind::Aborted, str("roce: operation aborted: ", why)));
  for (auto& t : inflight_) completeQuietly(t, err);
  inflight_.clear();
  std::vector<std::shared_ptr<Task>> services;
  std::vector<Finished> finished;
  {
    std::lock_guard<std::mutex> g(mu_);
    services.swap(services_);
    finished.swap(finishedInline_);
  }
  for (auto& [t, e] : finished) completeQuietly(t, e);
  // Services end with the group; that is no failure of theirs to record.
  for (auto& t : services) {
    try {
      t->complete(err);
    } catch (...) {
    }
  }
  std::deque<std::shared_ptr<Task>> rest;
  {
    std::lock_guard<std::mutex> g(mu_);
    rest.swap(queue_);
    inflightCount_ = 0;
  }
  for (auto& t : rest) completeQuietly(t, err);
}

void Engine::failInflight(const std::string& why) {
  comm_->breakWith(why);
  auto err = std::make_exception_ptr(Error(ErrorKind::Comm, why));
  auto tasks = std::move(inflight_);
  inflight_.clear();
  {
    std::lock_guard<std::mutex> g(mu_);
    inflightCount_ = 0;
    for (auto& t : services_) tasks.push_back(t);
    services_.clear();
  }
  for (auto& t : tasks) completeQuietly(t, err);
}

void Engine::shutdown(std::chrono::milliseconds grace) {
  const auto until = Clock::now() + grace;
  // An operation running on a caller's thread (runInline) holds mu_ until it
  // ends: give it the same grace as queued work, then interrupt it, so that
  // a shutdown from another thread never waits for a hung operation.
  while (callerRunning_.load() && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (callerRunning_.load()) comm_->requestAbort("the process group was shut down");
  {
    std::unique_lock<std::mutex> g(mu_);
    idleCv_.wait_until(g, until, [&] { return queue_.empty() && inflightCount_ == 0 && !running_; });
    graceful_ = true;
  }
  stopThread("the process group was shut down");
}

void Engine::abort(const std::string& why) { stopThread(why); }

void Engine::requestStop(const std::string& why) {
  // First, without the mutex: a caller running an operation inline holds it
  // until the operation ends, and this is what interrupts its waits.
  if (comm_) comm_->requestAbort(why);
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!stop_) {
      stop_ = true;
      stopReason_ = why;
    }
  }
  cv_.notify_all();
  if (comm_) comm_->wakeIdle();  // an idle engine may be polling its sockets
}

void Engine::stopThread(const std::string& why) {
  requestStop(why);
  if (thread_.joinable()) {
    if (thread_.get_id() == std::this_thread::get_id()) {
      std::lock_guard<std::mutex> g(mu_);
      detached_ = true;
      thread_.detach();
      return;  // the thread still owns comm_ until it returns
    }
    thread_.join();
  } else {
    // Detached: the loop still owns comm_ until it returns; only the
    // destructor waits for that (a repeated abort must not: the loop's
    // last callbacks may call abort() themselves).
    std::lock_guard<std::mutex> g(mu_);
    if (detached_) return;
  }
  // Release sockets, shared memory and the store connection now, even if
  // Python keeps the process-group object alive after destroy_process_group.
  // Neighbours learn whether this was an orderly exit or an abort.
  if (comm_ && graceful_) comm_->leaveGracefully();
  comm_.reset();
}

}  // namespace roce::engine
