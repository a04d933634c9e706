#include "shm_segment.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <string>
#include <utility>

#include "../../common/config.hpp"
#include "../../common/error.hpp"
#include "../../common/log.hpp"
#include "../../common/parse.hpp"
#include "../../common/random.hpp"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older headers lack the name
#endif

namespace roce::transport::shm {
namespace {
constexpr size_t kPage = 4096;
// The end of the names of segments whose creator holds their lock.
const std::string kLockedSuffix = ".lk";
// How old a leftover of a version that did not lock must be before it goes.
constexpr std::chrono::seconds kUnlockedLeftoverAge{3600};
}  // namespace

bool ShmSegment::canPopulate() {
  static const bool yes = [] {
    // The segments' layout is in 4 KiB pages (node_shm.cpp): with larger
    // pages (aarch64 kernels with 64 KiB pages) a ring's range would not be
    // page-aligned, so everything is reserved up front there.
    if (sysconf(_SC_PAGESIZE) != static_cast<long>(kPage)) return false;
    void* p = mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return false;
    const bool ok = madvise(p, kPage, MADV_POPULATE_WRITE) == 0;
    munmap(p, kPage);
    return ok;
  }();
  return yes;
}

int ShmSegment::populate(char* at, size_t len) {
  const auto begin = reinterpret_cast<uintptr_t>(at) & ~uintptr_t(kPage - 1);
  const auto end = (reinterpret_cast<uintptr_t>(at) + len + kPage - 1) & ~uintptr_t(kPage - 1);
  return madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE) == 0 ? 0 : errno;
}

int ShmSegment::allocate(char* at, size_t len) {
  if (testFault() == "shm_full") return EFAULT;
  return canPopulate() ? populate(at, len) : 0;
}

void ShmSegment::throwFull(const std::string& what, int err, const char* setting) {
  // EFAULT: the page fault would have raised SIGBUS (tmpfs out of space).
  throwComm(str("could not allocate ", what, " in /dev/shm (", err == EFAULT ? "no space left" : std::strerror(err),
                "): free space in /dev/shm (containers: docker run --shm-size=1g or larger), or shrink ", setting));
}

namespace {

// Whether a locked segment (opened as `fd`) is a leftover: its creator's
// lock is free, so the process that created it is gone. Taking the lock
// keeps it until `fd` is closed: the name must go while it is held, since a
// creator between shm_open and its flock would otherwise get the lock right
// after this check and keep a name that is about to be removed (it looks at
// its name only once it holds the lock).
bool lockFreed(int fd) { return flock(fd, LOCK_EX | LOCK_NB) == 0; }  // EWOULDBLOCK: it lives

}  // namespace

int ShmSegment::sweepLeftovers(const std::string& namePrefix) {
  DIR* dir = opendir("/dev/shm");
  if (!dir) return 0;
  const std::string lead = namePrefix + ".";
  const time_t now = time(nullptr);
  int removed = 0;
  while (const dirent* e = readdir(dir)) {
    const std::string name = e->d_name;
    if (name.rfind(lead, 0) != 0) continue;
    const size_t dot = name.find('.', lead.size());
    uint64_t pid = 0;
    if (dot == std::string::npos || !parseU64(name.substr(lead.size(), dot - lead.size()), 1, INT32_MAX, pid))
      continue;
    const bool locked = name.size() > kLockedSuffix.size() &&
                        name.compare(name.size() - kLockedSuffix.size(), kLockedSuffix.size(), kLockedSuffix) == 0;
    const int fd = openat(dirfd(dir), e->d_name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) continue;
    struct stat st;
    bool gone = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid();
    if (gone && locked) {
      gone = lockFreed(fd);
    } else if (gone) {
      gone = now - st.st_mtime >= kUnlockedLeftoverAge.count() && kill(static_cast<pid_t>(pid), 0) != 0 &&
             errno == ESRCH;
    }
    if (gone && shm_unlink(("/" + name).c_str()) == 0) ++removed;
    close(fd);  // only now the lock goes
  }
  closedir(dir);
  if (removed > 0)
    ROCE_WARN("roce: removed ", removed, " shared-memory segment(s) /dev/shm/", lead,
              "* left by processes killed while their group formed");
  return removed;
}

ShmSegment ShmSegment::create(size_t bytes, const std::string& namePrefix, const Ranges& reserve) {
  sweepLeftovers(namePrefix);
  ShmSegment s;
  int fd = -1;
  // A sweep removes a name only in the instant between its shm_open and its
  // lock: many losses in a row mean something else removes the names.
  constexpr int kTries = 64;
  for (int attempt = 1;; ++attempt) {
    // The creator's pid in the name is what sweepLeftovers reads for segments
    // of versions that did not lock.
    s.name_ = str("/", namePrefix, ".", getpid(), ".", std::hex, randomNonce(), kLockedSuffix);
    fd = shm_open(s.name_.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0)
      throwComm(str("shm_open(", s.name_, ") failed: ", std::strerror(errno),
                    " (is /dev/shm mounted and writable?)"));
    // Between shm_open and the lock, a sweep may find the name unlocked and
    // remove it: then the name no longer leads to this file, and another is tried.
    struct stat mine{}, named{};
    const bool locked = flock(fd, LOCK_EX) == 0;
    if (locked && fstat(fd, &mine) == 0 && stat(("/dev/shm" + s.name_).c_str(), &named) == 0 &&
        named.st_ino == mine.st_ino && named.st_dev == mine.st_dev)
      break;
    if (!locked) shm_unlink(s.name_.c_str());  // still this process's name: a sweep cannot lock it either
    close(fd);
    if (attempt == kTries)
      throwComm(str("could not keep a shared-memory segment /dev/shm/", namePrefix, ".*: ", kTries, " in a row were removed as they were created. Another program is deleting "
                    "/dev/shm entries (a cleanup job?), or /dev/shm does not support flock; set "
                    "ROCE_PG_FORCE_NETWORK=1 to run without shared memory"));
  }
  s.owner_ = true;
  s.lockFd_ = fd;
  int rc = ftruncate(fd, static_cast<off_t>(bytes)) == 0 ? 0 : errno;
  const Ranges all{{0, bytes}};
  size_t reserved = 0;
  for (const auto& [at, len] : reserve.empty() ? all : reserve) {
    if (rc == 0) rc = posix_fallocate(fd, static_cast<off_t>(at), static_cast<off_t>(len));
    reserved += len;
  }
  if (rc != 0)
    throwComm(str("could not reserve ", (reserved + (1 << 20) - 1) >> 20, " MiB in /dev/shm for ", s.name_, ": ",
                  std::strerror(rc),
                  ". Free space in /dev/shm (containers: docker run --shm-size=1g or larger), "
                  "or shrink ROCE_PG_SHM_SLOT_BYTES / ROCE_PG_SHM_RING_BYTES"));  // `s` unlinks it
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) throwComm(str("mmap of ", s.name_, " failed: ", std::strerror(errno)));  // `s` unlinks it
  s.base_ = static_cast<char*>(p);
  s.size_ = bytes;
  return s;
}

ShmSegment ShmSegment::open(const std::string& name, size_t bytes, int peerRank) {
  int fd = shm_open(name.c_str(), O_RDWR | O_NOFOLLOW, 0600);
  if (fd < 0)
    throwComm(str("shm_open(", name, ") of rank ", peerRank, "'s segment failed: ", std::strerror(errno),
                  ". Ranks that share a boot id must also share /dev/shm; if they run in "
                  "separate containers, set ROCE_PG_FORCE_NETWORK=1"));
  struct stat st{};
  if (fstat(fd, &st) != 0 || st.st_uid != geteuid() || static_cast<size_t>(st.st_size) < bytes) {
    close(fd);
    throwComm(str("rank ", peerRank, "'s shared-memory segment ", name, " is not what it should be (owner uid ",
                  st.st_uid, ", this process runs as ", geteuid(), "; size ", st.st_size, ", expected >= ", bytes,
                  "): ranks of one group on one machine must run as the same user with the same "
                  "ROCE_PG_SHM_* settings"));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) throwComm(str("mmap of peer segment ", name, " failed: ", std::strerror(errno)));
  ShmSegment s;
  s.base_ = static_cast<char*>(p);
  s.size_ = bytes;
  s.name_ = name;
  return s;
}

ShmSegment& ShmSegment::operator=(ShmSegment&& o) noexcept {
  if (this != &o) {
    release();
    base_ = o.base_; size_ = o.size_; name_ = std::move(o.name_); owner_ = o.owner_;
    lockFd_ = std::exchange(o.lockFd_, -1);
    o.base_ = nullptr; o.size_ = 0; o.owner_ = false;
  }
  return *this;
}

void ShmSegment::unlink() {
  if (owner_) shm_unlink(name_.c_str());
  owner_ = false;
  // The name is gone, and with it what the lock protected.
  if (lockFd_ >= 0) close(std::exchange(lockFd_, -1));
}

void ShmSegment::release() {
  unlink();
  if (base_) munmap(base_, size_);
  base_ = nullptr;
  size_ = 0;
}

ShmSegment::~ShmSegment() { release(); }

}  // namespace roce::transport::shm
