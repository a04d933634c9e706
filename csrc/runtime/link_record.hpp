// The records a process link carries (process_links.hpp): a 32-byte head,
// then up to kMaxRecordText bytes of text, then the job secret's MAC of both
// (kMacBytes, common/job_secret.hpp), so that bytes injected into an
// established link by someone without the secret are told from a peer's.
// Apart from the links so that the parser is a pure function on a buffer,
// which a fuzzer can drive (tests/fuzz/fuzz_link_records.cpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "../common/job_secret.hpp"

namespace roce::runtime {

constexpr uint32_t kLinkMagic = 0x4c494e4b;  // "LINK"
constexpr size_t kMaxRecordText = 4096;
// The first record on a dialed link: the dialer's process key.
constexpr uint16_t kIdentityRecord = 0x100;
// The acceptor's last record on a link whose name it refused: why
// (link_identity.hpp), so the dialer's lifelines say it instead of "died".
constexpr uint16_t kRefusedRecord = 0x103;

struct RecordHead {
  uint32_t magic;
  uint16_t type;
  uint16_t len;  // text bytes that follow
  int32_t srcRank;
  uint32_t reserved;
  uint64_t dstNonce;
  uint64_t srcNonce;
};
static_assert(sizeof(RecordHead) == 32);

// Head, text and MAC as bytes to send; the text is cut at kMaxRecordText.
std::string encodeRecord(uint16_t type, int32_t srcRank, uint64_t dstNonce, uint64_t srcNonce, std::string_view text);

// The record at `at` in `buf`: Complete (head and text filled, `at` moved
// past it; text views buf), Partial (its bytes are still on their way: `at`
// unchanged), Corrupt (not a record: a wrong magic or a text longer than
// kMaxRecordText; the stream cannot be trusted after it) or Forged (its MAC
// is not the job secret's: the same, and counted apart). `at` moves only
// past a Complete record.
enum class RecordParse { Complete, Partial, Corrupt, Forged };
RecordParse nextRecord(std::string_view buf, size_t& at, RecordHead& head, std::string_view& text);

}  // namespace roce::runtime
