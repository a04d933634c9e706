#include "store_wire.hpp"

#include <bit>
#include <cstring>
#include <stdexcept>

namespace scale {
namespace {
// Both ends run on this host (x86-64 and arm64 are little endian), so the
// integers go as they lie in memory.
static_assert(std::endian::native == std::endian::little, "the store's wire format is little endian");
}  // namespace

void Writer::raw(const void* p, size_t n) { body_.append(static_cast<const char*>(p), n); }

Writer& Writer::u8(uint8_t v) {
  raw(&v, 1);
  return *this;
}

Writer& Writer::i64(int64_t v) {
  raw(&v, sizeof v);
  return *this;
}

Writer& Writer::str(const std::string& s) {
  const uint32_t n = static_cast<uint32_t>(s.size());
  raw(&n, sizeof n);
  raw(s.data(), s.size());
  return *this;
}

Writer& Writer::strs(const std::vector<std::string>& list) {
  const uint32_t n = static_cast<uint32_t>(list.size());
  raw(&n, sizeof n);
  for (const auto& s : list) str(s);
  return *this;
}

std::string Writer::frame() const {
  if (body_.size() > kMaxFrameBytes) throw std::runtime_error("store frame over 64 MiB");
  const uint32_t n = static_cast<uint32_t>(body_.size());
  std::string out(reinterpret_cast<const char*>(&n), sizeof n);
  return out + body_;
}

const char* Reader::take(size_t n) {
  if (static_cast<size_t>(end_ - p_) < n) throw std::runtime_error("store frame ends inside a field");
  const char* at = p_;
  p_ += n;
  return at;
}

uint8_t Reader::u8() { return static_cast<uint8_t>(*take(1)); }

int64_t Reader::i64() {
  int64_t v;
  std::memcpy(&v, take(sizeof v), sizeof v);
  return v;
}

std::string Reader::str() {
  uint32_t n;
  std::memcpy(&n, take(sizeof n), sizeof n);
  return std::string(take(n), n);
}

std::vector<std::string> Reader::strs() {
  uint32_t n;
  std::memcpy(&n, take(sizeof n), sizeof n);
  // Each string takes at least its 4-byte length: bounds a corrupt count.
  if (n > static_cast<size_t>(end_ - p_) / 4) throw std::runtime_error("store frame: list count past its end");
  std::vector<std::string> out;
  out.reserve(n);
  for (uint32_t i = 0; i < n; ++i) out.push_back(str());
  return out;
}

uint32_t frameLength(const char* p) {
  uint32_t n;
  std::memcpy(&n, p, sizeof n);
  return n;
}

}  // namespace scale
