// Shared-memory segments left in /dev/shm by processes killed before their
// peers mapped them (csrc/transport/shm/shm_segment.hpp, sweepLeftovers):
// removed only when their process is gone and they are old enough; a live
// process's segment, a young one, another prefix and a name that is not
// ours stay. Real files in /dev/shm, under a prefix of this test's own.
#include <fcntl.h>
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

}  // namespace

TEST(only_old_segments_of_gone_processes_are_removed) {
  const std::string dead = std::to_string(deadPid()), alive = std::to_string(getpid());
  const std::string oldDead = kPrefix + "." + dead + ".a1", youngDead = kPrefix + "." + dead + ".b2",
                    oldAlive = kPrefix + "." + alive + ".c3", notAPid = kPrefix + ".x" + dead + ".d4",
                    otherPrefix = kPrefix + "_other." + dead + ".e5";
  makeSegment(oldDead, 7200);
  makeSegment(youngDead, 60);
  makeSegment(oldAlive, 7200);
  makeSegment(notAPid, 7200);
  makeSegment(otherPrefix, 7200);
  CHECK_EQ(roce::transport::shm::ShmSegment::sweepLeftovers(kPrefix, std::chrono::seconds(3600)), 1);
  CHECK(!exists(oldDead));
  CHECK(exists(youngDead));
  CHECK(exists(oldAlive));
  CHECK(exists(notAPid));
  CHECK(exists(otherPrefix));
  // A second sweep finds nothing more.
  CHECK_EQ(roce::transport::shm::ShmSegment::sweepLeftovers(kPrefix, std::chrono::seconds(3600)), 0);
  for (const auto& n : {youngDead, oldAlive, notAPid, otherPrefix}) shm_unlink(("/" + n).c_str());
}

TEST(a_prefix_with_no_segments_removes_nothing) {
  CHECK_EQ(roce::transport::shm::ShmSegment::sweepLeftovers(kPrefix + "_none", std::chrono::seconds(0)), 0);
}
