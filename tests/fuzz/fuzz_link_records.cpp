// The process links' record parser (csrc/runtime/link_record.hpp) on any
// bytes: it never reads outside the buffer, never accepts a text longer than
// the limit or a record whose MAC is not the job secret's (none is adopted
// here: the empty key, as the corpus is signed), moves forward only past
// whole records, and what it accepts encodes and parses back to the same
// record; a record with one byte of its MAC changed is refused as forged.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "runtime/link_record.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view buf(reinterpret_cast<const char*>(data), size);
  size_t at = 0;
  roce::runtime::RecordHead head{};
  std::string_view text;
  for (;;) {
    const size_t before = at;
    if (roce::runtime::nextRecord(buf, at, head, text) != roce::runtime::RecordParse::Complete) {
      if (at != before) std::abort();
      break;
    }
    if (at <= before || at > size || text.size() != head.len || text.size() > roce::runtime::kMaxRecordText) std::abort();
    if (text.data() < buf.data() || text.data() + text.size() > buf.data() + size) std::abort();
    const std::string again = roce::runtime::encodeRecord(head.type, head.srcRank, head.dstNonce, head.srcNonce, text);
    size_t at2 = 0;
    roce::runtime::RecordHead head2{};
    std::string_view text2;
    if (roce::runtime::nextRecord(again, at2, head2, text2) != roce::runtime::RecordParse::Complete || at2 != again.size() ||
        head2.type != head.type || head2.srcRank != head.srcRank || head2.dstNonce != head.dstNonce ||
        head2.srcNonce != head.srcNonce || text2 != text)
      std::abort();
    std::string forged = again;
    forged.back() ^= 1;
    size_t at3 = 0;
    if (roce::runtime::nextRecord(forged, at3, head2, text2) != roce::runtime::RecordParse::Forged || at3 != 0)
      std::abort();
  }
  return 0;
}
