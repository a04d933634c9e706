// What every rank contributes to the checked collectives, and the exact
// results, computed here in closed form - never by the code under test, and
// in O(1) per element, so 1,024 ranks checking their results do not each
// replay the whole group's inputs.
#pragma once
#include <cstddef>
#include <cstdint>

namespace scale {

// Rank r's element i of an int64 reduction among n ranks:
//   (r + 1) * a(i) + ((r + i) mod n) * K,   a(i) = i mod 1000 + 1,  K = 2^24.
// Every rank differs in every element (a lost or doubled contribution shows),
// and K exceeds any (r + 1) * a(i) for n <= 16,384, so the MAX is decided by
// the rotated term: each element's maximum comes from a different rank.
constexpr int64_t kRotationWeight = int64_t(1) << 24;

inline int64_t weightOf(size_t i) { return static_cast<int64_t>(i % 1000) + 1; }

inline int64_t reduceInput(int rank, size_t i, int n) {
  return (rank + 1) * weightOf(i) + static_cast<int64_t>((rank + i) % static_cast<size_t>(n)) * kRotationWeight;
}

// Sum over r of (r + 1) is n(n+1)/2; the rotated terms are a permutation of 0..n-1.
inline int64_t expectedSum(size_t i, int n) {
  const int64_t nn = n;
  return weightOf(i) * nn * (nn + 1) / 2 + kRotationWeight * nn * (nn - 1) / 2;
}

// The rank whose rotated term is n - 1: r = (n - 1 - i) mod n.
inline int64_t expectedMax(size_t i, int n) {
  const size_t nn = static_cast<size_t>(n);
  const int winner = static_cast<int>((nn - 1 + nn - i % nn) % nn);
  return reduceInput(winner, i, n);
}

// Byte j of what rank `from` sends to rank `to` in the data-moving
// collectives (for a broadcast or an allgather block, `to` is 0).
inline uint8_t byteOf(int from, int to, size_t j) {
  return static_cast<uint8_t>(from * 131 + to * 31 + j * 7 + (j >> 8) + 1);
}

}  // namespace scale
