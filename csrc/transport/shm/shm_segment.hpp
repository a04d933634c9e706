// A POSIX shared-memory segment: created by one rank, mapped by the others on
// the same machine, unlinked as soon as every peer has mapped it (so nothing
// leaks in /dev/shm even if a process is killed later; one killed before
// that leaves its segment, which the next process removes: sweepLeftovers).
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
  // The first create() of a process removes what sweepLeftovers() finds
  // when an hour old.
  static ShmSegment create(size_t bytes, const std::string& namePrefix, const Ranges& reserve = {});
  // Names live only until every local rank mapped them, but a process killed
  // in between leaves its segment in /dev/shm. Unlinks this user's
  // "/<namePrefix>.<pid>.<hex>" segments whose process is gone and whose
  // last change is at least `minAge` old (another pid namespace sharing
  // /dev/shm may run a formation whose creator this process cannot see; no
  // formation takes that long). Returns how many it removed.
  static int sweepLeftovers(const std::string& namePrefix, std::chrono::seconds minAge);
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
  size_t size_ = 0;
  std::string name_;
  bool owner_ = false;
};

}  // namespace roce::transport::shm
