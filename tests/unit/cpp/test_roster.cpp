// Who is in a group (csrc/membership/rank_info.*, roster.*): a rank's
// published info and the leader's roster survive their text forms; text from
// the store that is malformed is refused as a Comm error naming the field;
// the leader's checks refuse mismatched settings as Invalid errors naming
// the ranks and the variable to fix; a subgroup's roster derived from its
// parent's picks the members, their nonces, the network and the channels.
#include <cstdint>
#include <string>
#include <vector>

#include "common/config.hpp"
#include "membership/rank_info.hpp"
#include "membership/roster.hpp"
#include "roce_check.hpp"

using roce::Config;
using roce::membership::RankInfo;
using roce::membership::Roster;

namespace {

RankInfo rankOn(const std::string& node, int pid, int verbsRails = 1, int cpus = 16) {
  RankInfo r;
  r.nodeId = node;
  r.hostId = node + "/7f3c-boot";
  r.pid = pid;
  r.tcpHost = "10.0.0." + std::to_string(node.size() + static_cast<size_t>(node.back()));
  r.tcpPort = 20000 + pid % 1000;
  r.verbsRails = verbsRails;
  r.noVerbsWhy = verbsRails ? "" : "no RDMA device\n(ibv_get_device_list found none)";
  r.nonce = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(pid);
  r.shmRingBytes = 1 << 21;
  r.shmSlotBytes = 1 << 20;
  r.algorithms = "ROCE_PG_ALGO_ALLREDUCE=auto ROCE_PG_CHUNK_BYTES=1048576";
  r.cpus = cpus;
  return r;
}

// Two machines, two ranks each: a, b, a, b.
std::vector<RankInfo> fourRanks() { return {rankOn("a", 101), rankOn("b", 202), rankOn("a", 103), rankOn("b", 204)}; }

// The fields a roster carries per rank (RankInfo's others are the leader's to check).
void checkSameRank(const RankInfo& got, const RankInfo& want) {
  CHECK_EQ(got.nodeId, want.nodeId);
  CHECK_EQ(got.hostId, want.hostId);
  CHECK_EQ(got.tcpHost, want.tcpHost);
  CHECK_EQ(got.tcpPort, want.tcpPort);
  CHECK_EQ(got.pid, want.pid);
  CHECK_EQ(got.nonce, want.nonce);
  CHECK_EQ(got.cpus, want.cpus);
  CHECK_EQ(got.verbsRails, want.verbsRails);
}

// The encoded rank info with line `index` (0-based) replaced by `value`.
std::string withLine(const RankInfo& r, int index, const std::string& value) {
  std::string s = r.encode(), out;
  size_t start = 0;
  for (int line = 0; start <= s.size(); ++line) {
    size_t end = s.find('\n', start);
    if (end == std::string::npos) end = s.size();
    out += (line ? "\n" : "") + (line == index ? value : s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

}  // namespace

TEST(rank_info_round_trip) {
  RankInfo r = rankOn("node-1", 4242, 2, 96);
  r.nonce = UINT64_MAX;
  const RankInfo back = RankInfo::decode(r.encode(), 3);
  checkSameRank(back, r);
  CHECK_EQ(back.shmRingBytes, r.shmRingBytes);
  CHECK_EQ(back.shmSlotBytes, r.shmSlotBytes);
  CHECK_EQ(back.algorithms, r.algorithms);
  CHECK(back.verbs());
  CHECK_EQ(back.hostName(), "node-1");
  // The reason for no verbs is one line on the wire.
  const RankInfo none = RankInfo::decode(rankOn("n", 5, 0).encode(), 0);
  CHECK(!none.verbs());
  CHECK_EQ(none.noVerbsWhy, "no RDMA device (ibv_get_device_list found none)");
}

TEST(rank_info_refuses_each_malformed_field) {
  const RankInfo r = rankOn("a", 100);
  // Lines: node host pid tcpHost port verbs nonce ring slot algorithms cpus why.
  struct Bad {
    int line;
    const char* value;
    const char* field;
  } cases[] = {{2, "0", "(pid)"},          {2, "12x", "(pid)"},
               {2, "2147483648", "(pid)"}, {4, "65536", "(TCP port)"},
               {5, "5", "(verbs port count)"}, {6, "-1", "(nonce)"},
               {7, "1099511627777", "(shared-memory layout)"}, {8, "", "(shared-memory layout)"},
               {10, "0", "(CPU count)"},   {0, "", "(machine identity)"},
               {1, "", "(machine identity)"}};
  for (const Bad& b : cases) {
    INFO("line ", b.line, " = '", b.value, "'");
    CHECK_ERROR(Comm, RankInfo::decode(withLine(r, b.line, b.value), 7),
                (std::string("rank 7 published malformed rank info in the store ") + b.field).c_str());
  }
  CHECK_ERROR(Comm, RankInfo::decode("a\nb\n1", 2), "rank 2 published malformed rank info in the store (missing fields)");
  CHECK_ERROR(Comm, RankInfo::decode("", 0), "mixed roce_pg versions across ranks");
}

TEST(roster_round_trip_shares_places) {
  Roster r;
  r.ranks = fourRanks();
  r.network = "verbs";
  r.forceNetwork = true;
  r.channels = 3;
  const std::string text = r.encode();
  // One place line per machine, one rank line per rank.
  size_t places = 0, rankLines = 0;
  for (size_t at = 0; (at = text.find("\nP ", at)) != std::string::npos; ++at) ++places;
  for (size_t at = 0; (at = text.find("\nR ", at)) != std::string::npos; ++at) ++rankLines;
  CHECK_EQ(places, 2u);
  CHECK_EQ(rankLines, 4u);
  CHECK_EQ(text.substr(0, text.find('\n')), "roster 1 4 verbs 1 3 2");
  const Roster back = Roster::decode(text, 4);
  CHECK_EQ(back.network, "verbs");
  CHECK(back.forceNetwork);
  CHECK_EQ(back.channels, 3);
  REQUIRE_EQ(back.ranks.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    INFO("rank ", i);
    checkSameRank(back.ranks[i], r.ranks[i]);
  }
}

TEST(roster_keeps_separators_out_of_strings) {
  Roster r;
  r.ranks = {rankOn("a", 1)};
  r.ranks[0].nodeId = "rack\t1";
  r.ranks[0].hostId = "host\nname/boot";
  const Roster back = Roster::decode(r.encode(), 1);
  REQUIRE_EQ(back.ranks.size(), 1u);
  CHECK_EQ(back.ranks[0].nodeId, "rack_1");
  CHECK_EQ(back.ranks[0].hostId, "host_name/boot");
}

TEST(roster_refuses_malformed_text) {
  Roster r;
  r.ranks = fourRanks();
  r.network = "tcp";
  const std::string good = r.encode();
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    const size_t at = s.find(from);
    REQUIRE(at != std::string::npos);
    return s.replace(at, from.size(), to);
  };
  const std::string cut = good.substr(0, good.rfind("R "));
  struct Bad {
    std::string text;
    int size;
    const char* what;
  } cases[] = {{"", 4, "(empty)"},
               {replaced("roster 1", "roster 2"), 4, "(header)"},
               {replaced("roster 1 4 tcp 0 1 2", "roster 1 4 tcp 0 1"), 4, "(header)"},
               {good, 5, "(rank count)"},
               {replaced(" tcp ", " ib "), 4, "(network transport)"},
               {replaced("tcp 0", "tcp 2"), 4, "(force flag)"},
               {replaced("tcp 0 1", "tcp 0 9"), 4, "(channel count)"},
               {replaced("tcp 0 1 2", "tcp 0 1 0"), 4, "(place count)"},
               {replaced("tcp 0 1 2", "tcp 0 1 3"), 4, "(place line)"},
               {replaced("P a\t", "P \t"), 4, "(machine identity)"},
               {replaced("P a\ta/7f3c-boot\t", "P a\ta/7f3c-boot"), 4, "(place fields)"},
               {cut, 4, "(missing ranks)"},
               {replaced("R 1 ", "R 2 "), 4, "(rank 1)"},  // only places 0 and 1 exist
               {replaced("R 0 101", "R 0 0"), 4, "(rank 0)"}};
  for (const Bad& b : cases) {
    INFO("expecting ", b.what);
    CHECK_ERROR(Comm, Roster::decode(b.text, b.size),
                (std::string("the group's roster published by rank 0 is malformed ") + b.what).c_str());
  }
}

TEST(leader_verdict_is_rethrown_as_the_error_it_was) {
  CHECK_ERROR(Invalid, Roster::decodeOrThrow("error 0\nroce: ranks 0 and 1 disagree", 2), "ranks 0 and 1 disagree");
  CHECK_ERROR(Timeout, Roster::decodeOrThrow("error 1\nroce: too slow", 2), "too slow");
  CHECK_ERROR(Comm, Roster::decodeOrThrow("error 2\nroce: gone", 2), "gone");
  CHECK_ERROR(Comm, Roster::decodeOrThrow("error 7\nx", 2), "malformed (error record)");
  CHECK_ERROR(Comm, Roster::decodeOrThrow("error 0", 2), "malformed (error record)");
  Roster r;
  r.ranks = {rankOn("a", 9)};
  CHECK_EQ(Roster::decodeOrThrow(r.encode(), 1).ranks.size(), 1u);
}

TEST(plan_group_decides_network_and_channels) {
  Config cfg;
  const Roster two = roce::membership::planGroup(cfg, fourRanks());
  CHECK_EQ(two.network, "verbs");
  CHECK_EQ(two.ranks.size(), 4u);
  // 16 CPUs, 2 ranks per machine: 16 / (2 * 2) = 4 channels; the smallest wish wins.
  CHECK_EQ(two.channels, 4);
  std::vector<RankInfo> slow = fourRanks();
  slow[3].cpus = 4;  // 4 / (2 * 2) = 1
  CHECK_EQ(roce::membership::planGroup(cfg, slow).channels, 1);
  cfg.algo.nChannels = 3;  // ROCE_PG_NCHANNELS set: taken as is
  CHECK_EQ(roce::membership::planGroup(cfg, slow).channels, 3);

  Config plain;
  const std::vector<RankInfo> local = {rankOn("a", 1), rankOn("a", 2, 0)};
  CHECK_EQ(roce::membership::planGroup(plain, local).network, "none");  // one machine: no network, no port needed
  Config forced;
  forced.placement.forceNetwork = true;
  forced.placement.netTransport = roce::NetTransport::Tcp;
  const Roster f = roce::membership::planGroup(forced, local);
  CHECK_EQ(f.network, "tcp");
  CHECK(f.forceNetwork);
  CHECK_EQ(roce::membership::planGroup(forced, {rankOn("a", 1)}).network, "none");  // alone: nobody to reach
  Config tcp;
  tcp.placement.netTransport = roce::NetTransport::Tcp;
  std::vector<RankInfo> noPort = fourRanks();
  noPort[1].verbsRails = 0;
  CHECK_EQ(roce::membership::planGroup(tcp, noPort).network, "tcp");
}

TEST(plan_group_refuses_what_ranks_must_agree_on) {
  Config cfg;
  std::vector<RankInfo> algo = fourRanks();
  algo[2].algorithms = "ROCE_PG_ALGO_ALLREDUCE=ring ROCE_PG_CHUNK_BYTES=1048576";
  CHECK_ERROR(Invalid, roce::membership::planGroup(cfg, algo), "ranks 0 and 2 use different algorithm settings");
  CHECK_ERROR(Invalid, roce::membership::planGroup(cfg, algo), "rank 2: ROCE_PG_ALGO_ALLREDUCE=ring");

  std::vector<RankInfo> shm = fourRanks();
  shm[3].shmSlotBytes = 4096;  // rank 3 shares machine b with rank 1
  CHECK_ERROR(Invalid, roce::membership::planGroup(cfg, shm), "ranks 1 and 3 on one machine (b) use different shared-memory layouts");
  CHECK_ERROR(Invalid, roce::membership::planGroup(cfg, shm), "ROCE_PG_SHM_SLOT_BYTES 1048576 vs 4096");
  std::vector<RankInfo> apart = fourRanks();
  apart[1].shmRingBytes = apart[3].shmRingBytes = 1 << 16;  // machine b alike, a differs: allowed
  CHECK_EQ(roce::membership::planGroup(cfg, apart).ranks.size(), 4u);

  std::vector<RankInfo> noPort = fourRanks();
  noPort[1].verbsRails = 0;
  noPort[1].noVerbsWhy = "mlx5_0 port 1 is DOWN";
  CHECK_ERROR(Invalid, roce::membership::planGroup(cfg, noPort), "this group spans several machines but not every rank has a usable RDMA port");
  CHECK_ERROR(Invalid, roce::membership::planGroup(cfg, noPort), "\n  rank 1: mlx5_0 port 1 is DOWN");
  CHECK_ERROR(Invalid, roce::membership::planGroup(cfg, noPort), "set ROCE_PG_NET_TRANSPORT=tcp");
  Config forced;
  forced.placement.forceNetwork = true;
  CHECK_ERROR(Invalid, roce::membership::planGroup(forced, {rankOn("a", 1), rankOn("a", 2, 0)}),
              "this group spans the network (ROCE_PG_FORCE_NETWORK=1)");
}

TEST(derived_nonce_is_the_same_everywhere_and_differs_per_group) {
  // Pinned values: every rank computes them apart and must agree (also on a
  // platform whose char is signed: the name below has a byte >= 0x80).
  // Computed apart, in Python: FNV-1a 64 (basis 0xcbf29ce484222325, prime
  // 0x100000001b3) of the name's bytes, xor the parent's nonce, splitmix64.
  CHECK_EQ(roce::membership::derivedNonce(0, ""), 17665956581633026203ull);
  CHECK_EQ(roce::membership::derivedNonce(12345, "pp_dp_0"), 14529085965382083371ull);
  CHECK_EQ(roce::membership::derivedNonce(0xdeadbeefcafef00dull, "gr\xc3\xbcppe"), 9083693330935227611ull);
  const uint64_t n = roce::membership::derivedNonce(77, "tp");
  CHECK_NE(n, roce::membership::derivedNonce(77, "dp"));
  CHECK_NE(n, roce::membership::derivedNonce(78, "tp"));
  CHECK_NE(n, 77u);
}

TEST(derive_roster_for_a_subgroup) {
  Config cfg;
  Roster parent = roce::membership::planGroup(cfg, fourRanks());
  REQUIRE_EQ(parent.network, "verbs");
  // Members 3 and 1: both on machine b, in that order.
  const Roster sub = roce::membership::deriveRoster(cfg, parent, {3, 1}, "pair");
  REQUIRE_EQ(sub.ranks.size(), 2u);
  CHECK_EQ(sub.ranks[0].pid, parent.ranks[3].pid);
  CHECK_EQ(sub.ranks[1].pid, parent.ranks[1].pid);
  CHECK_EQ(sub.ranks[0].nonce, roce::membership::derivedNonce(parent.ranks[3].nonce, "pair"));
  CHECK_EQ(sub.ranks[1].nonce, roce::membership::derivedNonce(parent.ranks[1].nonce, "pair"));
  CHECK_EQ(sub.network, "none");  // one machine
  CHECK_EQ(sub.channels, 4);      // 16 CPUs / (2 * 2 members on b)
  // Across both machines: the parent's transport.
  const Roster across = roce::membership::deriveRoster(cfg, parent, {0, 1}, "x");
  CHECK_EQ(across.network, "verbs");
  CHECK_EQ(across.channels, 4);  // 16 / (2 * 1)
  // One member per machine gets the channels of a whole machine's CPUs.
  std::vector<RankInfo> few = fourRanks();
  for (RankInfo& r : few) r.cpus = 6;
  parent = roce::membership::planGroup(cfg, few);
  CHECK_EQ(parent.channels, 1);                                       // 6 / 4
  CHECK_EQ(roce::membership::deriveRoster(cfg, parent, {0, 1}, "x").channels, 3);  // 6 / 2
  // Forced network: even members on one machine use it.
  Config forced;
  forced.placement.forceNetwork = true;
  forced.placement.netTransport = roce::NetTransport::Tcp;
  const Roster fp = roce::membership::planGroup(forced, fourRanks());
  const Roster fs = roce::membership::deriveRoster(forced, fp, {0, 2}, "same-machine");
  CHECK(fs.forceNetwork);
  CHECK_EQ(fs.network, "tcp");
  // Every member computes the same roster: it survives the text form as is.
  const Roster back = Roster::decode(sub.encode(), 2);
  for (size_t i = 0; i < 2; ++i) checkSameRank(back.ranks[i], sub.ranks[i]);
}

TEST(derive_roster_refuses_ranks_outside_the_parent) {
  Config cfg;
  const Roster parent = roce::membership::planGroup(cfg, fourRanks());
  CHECK_ERROR(Invalid, roce::membership::deriveRoster(cfg, parent, {0, 4}, "g"),
              "subgroup rank 4 is not a rank of the parent group (4 ranks)");
  CHECK_ERROR(Invalid, roce::membership::deriveRoster(cfg, parent, {-1}, "g"), "subgroup rank -1 is not a rank");
}
