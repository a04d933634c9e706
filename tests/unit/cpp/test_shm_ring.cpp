// The single-producer single-consumer byte ring of the shared-memory
// transport (csrc/transport/shm/shm_ring.hpp), on ordinary memory: the
// indices, the wrap of the data and of the 64-bit counters, partial writes
// when full, gathers from several iovecs, impossible indices refused as
// corruption, and a producer and a consumer thread streaming through it.
#include <sys/uio.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "roce_check.hpp"
#include "transport/shm/shm_ring.hpp"

using roce::transport::shm::ShmRing;
using roce::transport::shm::ShmRingControl;

namespace {

struct Ring {
  ShmRingControl ctl{};
  std::vector<char> data;
  ShmRing ring;
  explicit Ring(size_t capacity, uint64_t start = 0) : data(capacity) {
    ctl.head.store(start);
    ctl.tail.store(start);
    ring = ShmRing(&ctl, data.data(), capacity);
  }
  size_t put(const std::string& s) {
    iovec iov{const_cast<char*>(s.data()), s.size()};
    return ring.write(&iov, 1, 3);
  }
  std::string take(size_t n) {
    std::string out(n, '\0');
    out.resize(ring.read(out.data(), n, 3));
    return out;
  }
};

std::string letters(size_t n, char first = 'a') {
  std::string s(n, ' ');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(first + i % 26);
  return s;
}

}  // namespace

TEST(control_words_sit_on_their_own_cache_lines) {
  CHECK_EQ(sizeof(ShmRingControl), 128u);
  CHECK_EQ(alignof(ShmRingControl), 64u);
  CHECK_EQ(offsetof(ShmRingControl, tail) - offsetof(ShmRingControl, head), 64u);
}

TEST(write_then_read_and_the_indices) {
  Ring r(64);
  CHECK_EQ(r.take(10), "");  // empty
  CHECK_EQ(r.put("hello"), 5u);
  CHECK_EQ(r.ctl.head.load(), 5u);
  CHECK_EQ(r.ctl.tail.load(), 0u);
  CHECK_EQ(r.take(3), "hel");
  CHECK_EQ(r.take(10), "lo");  // no more than there is
  CHECK_EQ(r.ctl.tail.load(), 5u);
}

TEST(full_ring_takes_what_fits) {
  Ring r(64);
  const std::string s = letters(100);
  CHECK_EQ(r.put(s), 64u);
  CHECK_EQ(r.put("x"), 0u);
  CHECK_EQ(r.take(64), s.substr(0, 64));
  CHECK_EQ(r.put("x"), 1u);
}

TEST(data_wraps_around_the_end) {
  Ring r(64);
  CHECK_EQ(r.put(letters(50)), 50u);
  CHECK_EQ(r.take(50), letters(50));
  const std::string s = letters(40, 'A');  // 14 bytes to the end, 26 from the start
  CHECK_EQ(r.put(s), 40u);
  CHECK_EQ(std::string(r.data.data() + 50, 14), s.substr(0, 14));
  CHECK_EQ(std::string(r.data.data(), 26), s.substr(14));
  CHECK_EQ(r.take(40), s);
}

TEST(counters_wrap_past_two_to_the_64) {
  Ring r(64, UINT64_MAX - 9);  // 10 bytes before the counters wrap
  const std::string s = letters(30);
  CHECK_EQ(r.put(s), 30u);
  CHECK_EQ(r.ctl.head.load(), 20u);  // wrapped
  CHECK_EQ(r.put(letters(40)), 34u);  // 64 - 30 bytes of space, across the wrap
  CHECK_EQ(r.take(30), s);
  CHECK_EQ(r.take(34), letters(40).substr(0, 34));
}

TEST(gathers_several_iovecs_and_stops_when_full) {
  Ring r(16);
  std::string a = "0123456789", b = "abcdefghij", c = "ZZZ";
  iovec iov[3] = {{a.data(), a.size()}, {b.data(), b.size()}, {c.data(), c.size()}};
  CHECK_EQ(r.ring.write(iov, 3, 1), 16u);
  CHECK_EQ(r.take(16), "0123456789abcdef");
}

TEST(impossible_indices_are_refused_naming_the_peer) {
  Ring r(64);
  r.ctl.head.store(100);  // 100 bytes unread in a 64-byte ring
  r.ctl.tail.store(0);
  char buf[8];
  CHECK_ERROR(Comm, r.ring.read(buf, 8, 5), "the shared-memory ring with rank 5 is corrupted (head 100, tail 0)");
  iovec iov{buf, 8};
  CHECK_ERROR(Comm, r.ring.write(&iov, 1, 5), "that process wrote over shared memory it does not own");
  r.ctl.head.store(0);
  r.ctl.tail.store(1);  // the reader ahead of the writer
  CHECK_ERROR(Comm, r.ring.read(buf, 8, 2), "ring with rank 2 is corrupted (head 0, tail 1)");
}

TEST(producer_and_consumer_threads_stream_exact_bytes) {
  // 8 MiB through a 4 KiB ring in uneven pieces on both sides.
  constexpr size_t kTotal = 8 << 20;
  Ring r(4096);
  auto byteAt = [](size_t i) { return static_cast<char>((i * 131) ^ (i >> 11)); };
  std::thread producer([&] {
    std::vector<char> chunk(1500);
    size_t sent = 0, k = 0;
    while (sent < kTotal) {
      const size_t want = std::min<size_t>(kTotal - sent, 1 + (k++ * 7919) % 1500);
      for (size_t i = 0; i < want; ++i) chunk[i] = byteAt(sent + i);
      size_t done = 0;
      while (done < want) {
        iovec iov{chunk.data() + done, want - done};
        const size_t n = r.ring.write(&iov, 1, 1);
        if (!n) std::this_thread::yield();
        done += n;
      }
      sent += want;
    }
  });
  std::vector<char> buf(1000);
  size_t got = 0, bad = 0, k = 0;
  while (got < kTotal) {
    const size_t n = r.ring.read(buf.data(), 1 + (k++ * 104729) % 1000, 0);
    if (!n) std::this_thread::yield();
    for (size_t i = 0; i < n; ++i) bad += buf[i] != byteAt(got + i);
    got += n;
  }
  producer.join();
  CHECK_EQ(got, kTotal);
  CHECK_EQ(bad, 0u);
  CHECK_EQ(r.ctl.head.load(), kTotal);
  CHECK_EQ(r.ctl.tail.load(), kTotal);
}
