// The scale harness's key-value store protocol, shared by the server (the
// launcher) and the client (every rank). One request, one reply, in order on
// each connection; every message is a frame:
//   u32 body length (little endian), body
// A request's body starts with its Op; fields are i64 (8 bytes, little
// endian), u8, strings (u32 length + bytes) and string lists (u32 count +
// strings). Replies:
//   SET -> (empty)   GET -> u8 found, string   ADD -> i64 new value
//   CHECK -> u8 exists   WAIT -> u8 all keys exist (0: the timeout passed)
//   MULTIGET -> u8 all keys exist, string list (empty strings where missing)
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace scale {

enum class Op : uint8_t { Set = 1, Get = 2, Add = 3, Check = 4, Wait = 5, MultiGet = 6 };

// A frame's body may not exceed this (a report of 1,024 ranks is far below).
constexpr uint32_t kMaxFrameBytes = 64u << 20;
constexpr size_t kFrameHeaderBytes = 4;

// Builds a frame: the fields in order, then frame() prepends the length.
class Writer {
 public:
  Writer() = default;  // a reply
  explicit Writer(Op op) { u8(static_cast<uint8_t>(op)); }  // a request
  Writer& u8(uint8_t v);
  Writer& i64(int64_t v);
  Writer& str(const std::string& s);
  Writer& strs(const std::vector<std::string>& list);
  std::string frame() const;

 private:
  void raw(const void* p, size_t n);
  std::string body_;
};

// Reads the fields of one frame's body; throws std::runtime_error past its end.
class Reader {
 public:
  explicit Reader(const std::string& body) : p_(body.data()), end_(body.data() + body.size()) {}
  uint8_t u8();
  int64_t i64();
  std::string str();
  std::vector<std::string> strs();

 private:
  const char* take(size_t n);
  const char* p_;
  const char* end_;
};

// The body length announced by a frame header (4 bytes at `p`).
uint32_t frameLength(const char* p);

}  // namespace scale
