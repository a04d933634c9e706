// A POSIX shared-memory segment: created by one rank, mapped by the others on
// the same machine, unlinked as soon as every peer has mapped it (so nothing
// leaks in /dev/shm even if a process is killed later).
#pragma once
#include <cstddef>
#include <string>

namespace roce {

class ShmSegment {
 public:
  // Creates a new segment with a unique name and reserves its pages up front,
  // so a full /dev/shm is reported here instead of as SIGBUS later.
  static ShmSegment create(size_t bytes, const std::string& namePrefix);
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

}  // namespace roce
