// A POSIX shared-memory segment: created by one rank, mapped by the others on
// the same machine, unlinked as soon as every peer has mapped it (so nothing
// leaks in /dev/shm even if a process is killed later). One killed before
// that leaves its segment behind: while a name exists its creator holds an
// flock on it, which the kernel drops when the process dies (in whatever pid
// namespace it ran), so sweepLeftovers() can tell a leftover from a segment
// still being formed, and the survivors of a failed formation remove it.
#pragma once
#include <chrono>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace roce::transport::shm {

class ShmSegment {
 public:
  // Creates a new segment with a unique name and reserves its pages up front,
  // so a full /dev/shm is reported here instead of as SIGBUS later: all of
  // them, or only the (offset, length) ranges in `reserve` if given. Pages
  // outside them must be populate()d before they are touched.
  using Ranges = std::vector<std::pair<size_t, size_t>>;
  // Every create() first removes what sweepLeftovers() finds.
  static ShmSegment create(size_t bytes, const std::string& namePrefix, const Ranges& reserve = {});
  // Names live only until every local rank mapped them, but a process killed
  // in between leaves its segment in /dev/shm. Unlinks this user's
  // "/<namePrefix>.<pid>.<hex>.lk" segments whose creator's lock is free
  // (it is gone), and "/<namePrefix>.<pid>.<hex>" ones (made by versions
  // that did not lock) whose pid is gone and whose last change is an hour
  // old (another pid namespace sharing /dev/shm may run a formation whose
  // creator this process cannot see). Returns how many it removed. Called
  // by create() and by a formation that failed.
  static int sweepLeftovers(const std::string& namePrefix);
  // Whether populate() works here (MADV_POPULATE_WRITE, Linux 5.14, and 4 KiB
  // pages): if not, callers reserve everything at create() and never call it.
  static bool canPopulate();
  // Allocates the pages of [at, at + len) of a mapping (rounded out to
  // pages) without touching them: 0, or the errno of the failure (EFAULT or
  // ENOMEM: /dev/shm is full) instead of a SIGBUS at first touch.
  static int populate(char* at, size_t len);
  // What a lazily allocated range's first writer calls: populate() where it
  // works, nothing where everything was reserved at create(). Under
  // ROCE_PG_TEST_FAULT=shm_full it fails as a full /dev/shm does (EFAULT),
  // on every kernel, so the failure path is tested everywhere.
  static int allocate(char* at, size_t len);
  // The error of a failed allocate(): what could not be allocated, the cause,
  // and the fix (free /dev/shm, or shrink the `setting` that sizes it).
  [[noreturn]] static void throwFull(const std::string& what, int err, const char* setting);
  // Maps a peer's segment after checking that this user owns it and that it
  // is at least `bytes` long (a shorter one would raise SIGBUS on access).
  static ShmSegment open(const std::string& name, size_t bytes, int peerRank);

  ShmSegment() = default;
  ShmSegment(ShmSegment&& o) noexcept { *this = std::move(o); }
  ShmSegment& operator=(ShmSegment&& o) noexcept;
  ~ShmSegment();

  void unlink();  // removes the name; the mapping stays valid
  char* data() const { return base_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  void release();  // unlink if owner, unmap
  char* base_ = nullptr;
  int lockFd_ = -1;  // owner: the descriptor whose flock says the creator lives, until unlink()
  size_t size_ = 0;
  std::string name_;
  bool owner_ = false;
};

}  // namespace roce::transport::shm
