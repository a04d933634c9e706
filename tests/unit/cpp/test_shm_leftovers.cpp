// Shared-memory segments left in /dev/shm by processes killed before their
// peers mapped them (csrc/transport/shm/shm_segment.hpp, sweepLeftovers):
// a locked name goes as soon as its creator is gone, however young; an
// unlocked one (an older version's) only when its pid is gone and it is an
// hour old; a live creator's segment, another prefix and a name that is not
// ours stay. Real files in /dev/shm, under a prefix of this test's own.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <ctime>
#include <string>

#include "roce_check.hpp"
#include "transport/shm/shm_segment.hpp"

namespace {

using roce::transport::shm::ShmSegment;

const std::string kPrefix = "roce_pg_unit_leftovers";

// A pid that belonged to a process which has exited (reaped).
pid_t deadPid() {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  int status = 0;
  waitpid(child, &status, 0);
  return child;
}

// Creates /dev/shm/<name> and sets its modification time `ageSeconds` back.
void makeSegment(const std::string& name, long ageSeconds) {
  const int fd = shm_open(("/" + name).c_str(), O_CREAT | O_RDWR, 0600);
  REQUIRE(fd >= 0);
  const timespec times[2] = {{time(nullptr) - ageSeconds, 0}, {time(nullptr) - ageSeconds, 0}};
  CHECK_EQ(futimens(fd, times), 0);
  close(fd);
}

bool exists(const std::string& name) {
  struct stat st;
  return stat(("/dev/shm/" + name).c_str(), &st) == 0;
}

// A child process that creates a segment under kPrefix as roce does, reports
// its name through a pipe and then waits to be killed.
pid_t creatorOf(std::string& name) {
  int pipeFds[2];
  REQUIRE(pipe(pipeFds) == 0);
  const pid_t child = fork();
  if (child == 0) {
    ShmSegment s = ShmSegment::create(4096, kPrefix);
    const std::string n = s.name().substr(1);
    if (write(pipeFds[1], n.data(), n.size()) != static_cast<ssize_t>(n.size())) _exit(1);
    close(pipeFds[1]);
    pause();
    _exit(0);
  }
  close(pipeFds[1]);
  char buf[256];
  const ssize_t n = read(pipeFds[0], buf, sizeof(buf));
  close(pipeFds[0]);
  REQUIRE(n > 0);
  name.assign(buf, static_cast<size_t>(n));
  return child;
}

}  // namespace

TEST(unlocked_segments_go_only_when_old_and_their_pid_is_gone) {
  const std::string dead = std::to_string(deadPid()), alive = std::to_string(getpid());
  const std::string oldDead = kPrefix + "." + dead + ".a1", youngDead = kPrefix + "." + dead + ".b2",
                    oldAlive = kPrefix + "." + alive + ".c3", notAPid = kPrefix + ".x" + dead + ".d4",
                    otherPrefix = kPrefix + "_other." + dead + ".e5";
  makeSegment(oldDead, 7200);
  makeSegment(youngDead, 60);
  makeSegment(oldAlive, 7200);
  makeSegment(notAPid, 7200);
  makeSegment(otherPrefix, 7200);
  CHECK_EQ(ShmSegment::sweepLeftovers(kPrefix), 1);
  CHECK(!exists(oldDead));
  CHECK(exists(youngDead));
  CHECK(exists(oldAlive));
  CHECK(exists(notAPid));
  CHECK(exists(otherPrefix));
  // A second sweep finds nothing more.
  CHECK_EQ(ShmSegment::sweepLeftovers(kPrefix), 0);
  for (const auto& n : {youngDead, oldAlive, notAPid, otherPrefix}) shm_unlink(("/" + n).c_str());
}

TEST(a_locked_segment_goes_as_soon_as_its_creator_dies) {
  std::string name;
  const pid_t creator = creatorOf(name);
  CHECK(exists(name));
  CHECK(name.size() > 3 && name.substr(name.size() - 3) == ".lk");
  // Its creator lives (and holds the lock): it stays, although a second old.
  CHECK_EQ(ShmSegment::sweepLeftovers(kPrefix), 0);
  CHECK(exists(name));
  kill(creator, SIGKILL);
  int status = 0;
  waitpid(creator, &status, 0);
  CHECK_EQ(ShmSegment::sweepLeftovers(kPrefix), 1);
  CHECK(!exists(name));
}

TEST(a_locked_name_whose_pid_lives_still_goes_when_unlocked) {
  // Another pid namespace may reuse the pid in the name: only the lock counts.
  const std::string name = kPrefix + "." + std::to_string(getpid()) + ".f6.lk";
  makeSegment(name, 0);
  CHECK_EQ(ShmSegment::sweepLeftovers(kPrefix), 1);
  CHECK(!exists(name));
}

TEST(a_segment_being_created_keeps_its_name_and_unlink_removes_it) {
  ShmSegment s = ShmSegment::create(8192, kPrefix);
  const std::string name = s.name().substr(1);
  CHECK_EQ(ShmSegment::sweepLeftovers(kPrefix), 0);  // this process holds its lock
  CHECK(exists(name));
  // A second process's sweep sees the lock taken too.
  const int fd = open(("/dev/shm/" + name).c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  CHECK(flock(fd, LOCK_EX | LOCK_NB) != 0);
  close(fd);
  s.unlink();
  CHECK(!exists(name));
}

TEST(a_prefix_with_no_segments_removes_nothing) { CHECK_EQ(ShmSegment::sweepLeftovers(kPrefix + "_none"), 0); }
