#include "link_record.hpp"

#include <cstring>

namespace roce::runtime {

std::string encodeRecord(uint16_t type, int32_t srcRank, uint64_t dstNonce, uint64_t srcNonce,
                         std::string_view text) {
  const std::string_view body = text.substr(0, kMaxRecordText);
  RecordHead h{kLinkMagic, type, static_cast<uint16_t>(body.size()), srcRank, 0, dstNonce, srcNonce};
  std::string out(reinterpret_cast<const char*>(&h), sizeof(h));
  out.append(body);
  const Mac m = JobSecret::mac(out.data(), out.size());
  out.append(reinterpret_cast<const char*>(m.data()), m.size());
  return out;
}

RecordParse nextRecord(std::string_view buf, size_t& at, RecordHead& head, std::string_view& text) {
  if (at > buf.size() || buf.size() - at < sizeof(RecordHead)) return RecordParse::Partial;
  std::memcpy(&head, buf.data() + at, sizeof(head));
  if (head.magic != kLinkMagic || head.len > kMaxRecordText) return RecordParse::Corrupt;
  const size_t signedBytes = sizeof(head) + head.len;
  if (buf.size() - at < signedBytes + kMacBytes) return RecordParse::Partial;
  if (!JobSecret::verify(buf.data() + at, signedBytes, reinterpret_cast<const uint8_t*>(buf.data() + at + signedBytes)))
    return RecordParse::Forged;
  text = buf.substr(at + sizeof(head), head.len);
  at += signedBytes + kMacBytes;
  return RecordParse::Complete;
}

}  // namespace roce::runtime
