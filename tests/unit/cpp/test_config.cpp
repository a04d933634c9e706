// The ROCE_PG_* configuration (csrc/common/config.*, env_reader.*): defaults,
// the accepted spellings, the normalisations (powers of two, alignment), the
// settings strings peers compare, the doctor's table, and a refusal naming
// the variable and the accepted range for every kind of bad value.
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "common/config.hpp"
#include "common/env_reader.hpp"
#include "roce_check.hpp"

extern char** environ;

namespace {

// Sets variables for one test and restores the environment after: every
// ROCE_PG_* variable of the process is cleared first, so a developer's own
// settings cannot change the outcome.
class Env {
 public:
  Env() {
    for (char** e = environ; *e; ++e) {
      const std::string kv = *e;
      if (kv.rfind("ROCE_PG_", 0) == 0) saved_.push_back(kv);
    }
    for (const std::string& kv : saved_) unsetenv(kv.substr(0, kv.find('=')).c_str());
  }
  ~Env() {
    for (const std::string& name : set_) unsetenv(name.c_str());
    for (const std::string& kv : saved_) {
      const size_t eq = kv.find('=');
      setenv(kv.substr(0, eq).c_str(), kv.substr(eq + 1).c_str(), 1);
    }
  }
  Env(const Env&) = delete;
  Env& operator=(const Env&) = delete;
  Env& operator()(const char* name, const char* value) {
    setenv(name, value, 1);
    set_.push_back(name);
    return *this;
  }

 private:
  std::vector<std::string> saved_, set_;
};

roce::Config read(const char* name, const char* value) {
  Env env;
  env(name, value);
  return roce::Config::fromEnv();
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(defaults_with_nothing_set) {
  Env env;
  const roce::Config c = roce::Config::fromEnv();
  CHECK(!c.placement.forceNetwork);
  CHECK_EQ(c.algo.allreduce, "auto");
  CHECK(c.algo.broadcast == roce::BroadcastShape::Auto);
  CHECK(c.placement.netTransport == roce::NetTransport::Auto);
  CHECK(c.connect == roce::ConnectMode::Lazy);
  CHECK(c.subgroups == roce::SubgroupMode::Parent);
  CHECK_EQ(c.algo.chunkBytes, size_t(1) << 20);
  CHECK_EQ(c.algo.rdMaxBytes, size_t(64) << 10);
  CHECK(!c.algo.rdMaxBytesSet && !c.algo.ringMinBytesSet && !c.algo.hierMinBytesSet);
  CHECK_EQ(c.algo.netGBps, 6.25);
  CHECK_EQ(c.algo.nChannels, 0);
  CHECK_EQ(c.workers, 0);
  CHECK_EQ(c.shm.ringBytes, size_t(2) << 20);
  CHECK_EQ(c.verbs.slots, 8);
  CHECK_EQ(c.verbs.gidIndex, -1);
  CHECK_EQ(c.spinUs, 20);
  CHECK_EQ(c.heartbeatTimeoutMs, 20000);
  CHECK_EQ(c.trace.signal, 0);
  CHECK(c.trace.torchFlightRecorder == roce::TorchRecorder::Native);
  CHECK(c.recordsNatively());
  CHECK(!c.testFailForming);
  // The cache-sized default: a power of two in [64 KiB, 1 MiB].
  CHECK_GE(c.shm.chunkBytes, size_t(64) << 10);
  CHECK_LE(c.shm.chunkBytes, size_t(1) << 20);
  CHECK_EQ(c.shm.chunkBytes & (c.shm.chunkBytes - 1), 0u);
  CHECK_EQ(c.shm.chunkBytes, roce::Config::shmChunkAuto());
}

TEST(integers_take_suffixes_and_any_base) {
  CHECK_EQ(read("ROCE_PG_CHUNK_BYTES", "4M").algo.chunkBytes, size_t(4) << 20);
  CHECK_EQ(read("ROCE_PG_CHUNK_BYTES", "8k").algo.chunkBytes, size_t(8) << 10);
  CHECK_EQ(read("ROCE_PG_CHUNK_BYTES", "1G").algo.chunkBytes, size_t(1) << 30);
  CHECK_EQ(read("ROCE_PG_CHUNK_BYTES", "0x2000").algo.chunkBytes, 8192u);
  CHECK_EQ(read("ROCE_PG_CHUNK_BYTES", "").algo.chunkBytes, size_t(1) << 20);  // empty: unset
  CHECK_EQ(read("ROCE_PG_IB_GID_INDEX", "-1").verbs.gidIndex, -1);
  CHECK_EQ(read("ROCE_PG_IB_GID_INDEX", "3").verbs.gidIndex, 3);
  CHECK_EQ(read("ROCE_PG_HEARTBEAT_TIMEOUT_MS", "0").heartbeatTimeoutMs, 0);  // off
}

TEST(sizes_are_normalised) {
  CHECK_EQ(read("ROCE_PG_SHM_RING_BYTES", "5000").shm.ringBytes, 8192u);  // rings index with a mask
  CHECK_EQ(read("ROCE_PG_SHM_RING_BYTES", "65536").shm.ringBytes, 65536u);
  CHECK_EQ(read("ROCE_PG_SHM_SLOT_BYTES", "4097").shm.slotBytes, 4160u);  // cache lines
  CHECK_EQ(read("ROCE_PG_SHM_CHUNK_BYTES", "100000").shm.chunkBytes, 65536u);  // power of two, down
  CHECK_EQ(read("ROCE_PG_SHM_CHUNK_BYTES", "4096").shm.chunkBytes, 4096u);
}

TEST(choices_flags_and_fallbacks) {
  CHECK_EQ(read("ROCE_PG_ALGO", "ring").algo.allreduce, "ring");
  // Enum settings: every name maps to its value, and the value prints back.
  CHECK(read("ROCE_PG_CONNECT", "eager").connect == roce::ConnectMode::Eager);
  CHECK(read("ROCE_PG_NET_TRANSPORT", "tcp").placement.netTransport == roce::NetTransport::Tcp);
  CHECK(read("ROCE_PG_NET_TRANSPORT", "verbs").placement.netTransport == roce::NetTransport::Verbs);
  CHECK(read("ROCE_PG_SUBGROUPS", "join").subgroups == roce::SubgroupMode::Join);
  CHECK(read("ROCE_PG_DEVICE_REDUCE", "device").device.reduce == roce::DeviceReduce::Device);
  CHECK(read("ROCE_PG_DEVICE_REDUCE", "host").device.reduce == roce::DeviceReduce::Host);
  CHECK(read("ROCE_PG_GPUDIRECT", "off").device.gpudirect == roce::GpudirectMode::Off);
  CHECK(read("ROCE_PG_TORCH_FR", "hook").trace.torchFlightRecorder == roce::TorchRecorder::Hook);
  CHECK_EQ(std::string(roce::settingName(roce::DeviceReduce::Device)), "device");
  {
    Env env;
    env("ROCE_PG_ALGO", "ring")("ROCE_PG_ALGO_ALLREDUCE", "tree");
    CHECK_EQ(roce::Config::fromEnv().algo.allreduce, "tree");  // the specific one wins
  }
  for (const char* yes : {"1", "true", "yes", "on"}) CHECK(read("ROCE_PG_FORCE_NETWORK", yes).placement.forceNetwork);
  for (const char* no : {"0", "false", "no", "off"}) CHECK(!read("ROCE_PG_FORCE_NETWORK", no).placement.forceNetwork);
  CHECK_EQ(read("ROCE_PG_TRACE_SIGNAL", "SIGUSR2").trace.signal, SIGUSR2);
  CHECK_EQ(read("ROCE_PG_TRACE_SIGNAL", "SIGUSR1").trace.signal, SIGUSR1);
  CHECK_EQ(read("ROCE_PG_SIM_NODE", "rack-1_a").placement.simNode, "rack-1_a");
  CHECK(!read("ROCE_PG_TORCH_FR", "hook").recordsNatively());
  CHECK(!read("ROCE_PG_TRACE_ENTRIES", "0").recordsNatively());
  CHECK(read("ROCE_PG_TEST_FAULT", "fail_forming").testFailForming);
  CHECK_EQ(read("ROCE_PG_ALGO_NET_ALPHA_US", "2.5e1").algo.netAlphaUs, 25.0);
}

TEST(bad_values_name_the_variable_and_what_is_accepted) {
  auto refuse = [](const char* name, const char* value, const char* why) {
    INFO(name, "=", value);
    Env env;
    env(name, value);
    CHECK_ERROR(Invalid, roce::Config::fromEnv(), why);
  };
  refuse("ROCE_PG_NET_TRANSPORT", "rdma", "ROCE_PG_NET_TRANSPORT='rdma': expected one of auto, verbs, tcp");
  refuse("ROCE_PG_CONNECT", "Eager", "ROCE_PG_CONNECT='Eager': expected one of lazy, eager");
  refuse("ROCE_PG_CHUNK_BYTES", "12abc", "ROCE_PG_CHUNK_BYTES='12abc' is not an integer in [4096, 1073741824]");
  refuse("ROCE_PG_CHUNK_BYTES", "100", "ROCE_PG_CHUNK_BYTES='100' is not an integer in [4096, 1073741824]");
  refuse("ROCE_PG_CHUNK_BYTES", "4MB", "is not an integer");
  // A suffix that would overflow is out of range, not wrapped into it.
  refuse("ROCE_PG_IB_POOL_BYTES", "9223372036854775807K", "ROCE_PG_IB_POOL_BYTES='9223372036854775807K' is not");
  refuse("ROCE_PG_IB_POOL_BYTES", "17179869184G", "is not an integer in");
  refuse("ROCE_PG_IB_SLOTS", "1", "ROCE_PG_IB_SLOTS='1' is not an integer in [2, 256]");
  refuse("ROCE_PG_NCHANNELS", "9", "ROCE_PG_NCHANNELS='9' is not an integer in [0, 8]");
  refuse("ROCE_PG_ALGO_ALLREDUCE", "fast", "ROCE_PG_ALGO_ALLREDUCE='fast': expected one of auto, rd, rabenseifner, ring, tree, hier");
  refuse("ROCE_PG_ALGO", "Ring", "ROCE_PG_ALGO='Ring': expected one of");
  refuse("ROCE_PG_CONNECT", "sometimes", "expected one of lazy, eager");
  refuse("ROCE_PG_FORCE_NETWORK", "2", "ROCE_PG_FORCE_NETWORK='2': use 1 or 0");
  refuse("ROCE_PG_ALGO_NET_GBPS", "fast", "ROCE_PG_ALGO_NET_GBPS='fast' is not a number in");
  refuse("ROCE_PG_ALGO_NET_GBPS", "nan", "is not a number in");
  refuse("ROCE_PG_ALGO_NET_GBPS", "0", "is not a number in");  // rates must be positive
  refuse("ROCE_PG_SIM_NODE", "a b", "ROCE_PG_SIM_NODE='a b': use up to 64 letters, digits, '-' or '_'");
  refuse("ROCE_PG_SIM_NODE", std::string(65, 'x').c_str(), "use up to 64 letters");
  refuse("ROCE_PG_HEARTBEAT_TIMEOUT_MS", "500", "ROCE_PG_HEARTBEAT_TIMEOUT_MS=500: heartbeats are sent every");
  refuse("ROCE_PG_HEARTBEAT_TIMEOUT_MS", "500", "use >= 1000 or 0 (off)");
  refuse("ROCE_PG_SHM_CHUNK_BYTES", "100", "use at least 4096, or 0 for the cache-sized default");
  refuse("ROCE_PG_TRACE_SIGNAL", "SIGTERM", "expected one of off, SIGUSR1, SIGUSR2");
  refuse("ROCE_PG_TEST_FAULT", "everything", "ROCE_PG_TEST_FAULT='everything': expected one of");
}

TEST(every_message_starts_with_roce) {
  Env env;
  env("ROCE_PG_SPIN_US", "-1");
  CHECK_ERROR(Invalid, roce::Config::fromEnv(), "roce: ROCE_PG_SPIN_US='-1'");
}

TEST(settings_table_lists_each_variable_once_with_its_domain) {
  Env env;
  env("ROCE_PG_CHUNK_BYTES", "garbage");  // the recording reader reads no environment
  const std::vector<roce::Setting> table = roce::Config::settings();
  std::set<std::string> names;
  for (const roce::Setting& s : table) {
    INFO(s.name);
    CHECK(s.name.rfind("ROCE_PG_", 0) == 0);
    CHECK(names.insert(s.name).second);
  }
  CHECK_GT(table.size(), 50u);
  auto find = [&](const char* name) -> const roce::Setting* {
    for (const roce::Setting& s : table)
      if (s.name == name) return &s;
    return nullptr;
  };
  using K = roce::Setting::Kind;
  const roce::Setting* chunk = find("ROCE_PG_CHUNK_BYTES");
  REQUIRE(chunk);
  CHECK_EQ(chunk->kind, K::Integer);
  CHECK_EQ(chunk->lo, 4096);
  CHECK_EQ(chunk->hi, 1ll << 30);
  CHECK(!chunk->zeroOk);
  const roce::Setting* heartbeat = find("ROCE_PG_HEARTBEAT_TIMEOUT_MS");
  REQUIRE(heartbeat);
  CHECK(heartbeat->zeroOk);
  CHECK_EQ(heartbeat->lo, 1000);
  const roce::Setting* node = find("ROCE_PG_SIM_NODE");
  REQUIRE(node);
  CHECK_EQ(node->kind, K::Token);
  CHECK_EQ(node->hi, 64);
  const roce::Setting* algo = find("ROCE_PG_ALGO_ALLREDUCE");
  REQUIRE(algo);
  CHECK_EQ(algo->kind, K::Choice);
  CHECK((algo->choices == std::vector<std::string>{"auto", "rd", "rabenseifner", "ring", "tree", "hier"}));
  const roce::Setting* gbps = find("ROCE_PG_ALGO_NET_GBPS");
  REQUIRE(gbps);
  CHECK_EQ(gbps->kind, K::Number);
  CHECK_EQ(gbps->numberHi, 1e6);
  REQUIRE(find("ROCE_PG_FORCE_NETWORK"));
  CHECK_EQ(find("ROCE_PG_FORCE_NETWORK")->kind, K::Flag);
  REQUIRE(find("ROCE_PG_IB_HCA"));
  CHECK_EQ(find("ROCE_PG_IB_HCA")->kind, K::Text);
  CHECK(find("ROCE_PG_TEST_FAULT"));
  // ROCE_PG_DEBUG is read by the logger, not here.
  CHECK(!find("ROCE_PG_DEBUG"));
  // Reading order: the generic ROCE_PG_ALGO is the fallback read just before the specific one.
  const auto pos = [&](const char* name) {
    return std::find_if(table.begin(), table.end(), [&](const roce::Setting& s) { return s.name == name; }) -
           table.begin();
  };
  CHECK_EQ(pos("ROCE_PG_ALGO") + 1, pos("ROCE_PG_ALGO_ALLREDUCE"));
}

TEST(algorithm_settings_tell_unset_thresholds_from_set_ones) {
  Env env;
  const std::string unset = roce::Config::fromEnv().algorithmSettings();
  CHECK(contains(unset, "ROCE_PG_ALGO_RD_MAX_BYTES=auto"));
  CHECK(contains(unset, "ROCE_PG_NCHANNELS=0"));  // 0 is auto, set or not
  env("ROCE_PG_ALGO_RD_MAX_BYTES", "65536");  // the default value, but set
  const std::string set = roce::Config::fromEnv().algorithmSettings();
  CHECK(contains(set, "ROCE_PG_ALGO_RD_MAX_BYTES=65536"));
  CHECK_NE(unset, set);
  // Cost constants print exactly (shortest round trip), so values one bit
  // apart never print alike.
  env("ROCE_PG_ALGO_NET_GBPS", "0.1");
  CHECK(contains(roce::Config::fromEnv().algorithmSettings(), " ROCE_PG_ALGO_NET_GBPS=0.1 "));
  env("ROCE_PG_ALGO_NET_GBPS", "0.10000000000000002");
  CHECK(contains(roce::Config::fromEnv().algorithmSettings(), " ROCE_PG_ALGO_NET_GBPS=0.10000000000000002 "));
  // Per-rank settings are not part of it: they may differ between ranks.
  env("ROCE_PG_WORKERS", "3")("ROCE_PG_SPIN_US", "5");
  const std::string perRank = roce::Config::fromEnv().algorithmSettings();
  CHECK(!contains(perRank, "WORKERS"));
  CHECK(!contains(perRank, "SPIN"));
}

TEST(what_ranks_compare_is_every_group_scoped_declaration_in_reading_order) {
  Env env;
  std::string expected, placement;
  for (const roce::Setting& s : roce::Config::settings()) {
    INFO(s.name);
    CHECK(!s.layer.empty());
    if (s.scope == roce::Scope::Group) expected += (expected.empty() ? "" : " ") + s.name + "=";
    if (s.placement) placement += (placement.empty() ? "" : " ") + s.name + "=";
  }
  // Values stripped: the names, in order, are what the declarations say.
  auto names = [](const std::string& settings) {
    std::string out;
    for (size_t at = 0; at < settings.size();) {
      const size_t eq = settings.find('=', at), space = settings.find(' ', eq);
      out += settings.substr(at, eq + 1 - at) + (space == std::string::npos ? "" : " ");
      at = space == std::string::npos ? settings.size() : space + 1;
    }
    return out;
  };
  const roce::Config c = roce::Config::fromEnv();
  CHECK_EQ(names(c.algorithmSettings()), expected);
  CHECK_EQ(names(c.placementSettings()), placement);
  // Per-rank and advised settings are not compared.
  CHECK(contains(expected, "ROCE_PG_IB_SLOTS="));
  CHECK(!contains(expected, "ROCE_PG_IB_QPS_PER_CONNECTION="));
  CHECK(!contains(expected, "ROCE_PG_NET_TRANSPORT="));
  CHECK(!contains(expected, "ROCE_PG_ALGO="));
  // ROCE_PG_ALGO reaches the comparison through the setting it defaults.
  env("ROCE_PG_ALGO", "ring");
  CHECK(contains(roce::Config::fromEnv().algorithmSettings(), "ROCE_PG_ALGO_ALLREDUCE=ring"));
  // describe() names every setting once, with what group creation resolves after it.
  const std::string all = roce::Config::fromEnv().describe();
  CHECK(contains(all, "ROCE_PG_ALGO=ring ROCE_PG_ALGO_ALLREDUCE=ring"));
  CHECK(contains(all, "; resolved: nchannels="));
}

TEST(placement_settings) {
  Env env;
  env("ROCE_PG_NET_TRANSPORT", "tcp")("ROCE_PG_SIM_RANKS_PER_NODE", "2");
  CHECK_EQ(roce::Config::fromEnv().placementSettings(),
           "ROCE_PG_FORCE_NETWORK=0 ROCE_PG_SIM_RANKS_PER_NODE=2 ROCE_PG_SIM_NODE= ROCE_PG_NET_TRANSPORT=tcp");
}

TEST(automatic_channels_and_workers) {
  // One channel per two CPUs of a local rank's share, 1 to 4.
  CHECK_EQ(roce::Config::channelsAuto(16, 2), 4);
  CHECK_EQ(roce::Config::channelsAuto(12, 2), 3);
  CHECK_EQ(roce::Config::channelsAuto(64, 1), 4);
  CHECK_EQ(roce::Config::channelsAuto(2, 4), 1);
  CHECK_EQ(roce::Config::channelsAuto(8, 0), 4);  // no local rank counted: as one
  // The CPU share, 1 to 8.
  CHECK_EQ(roce::Config::workersAuto(6, 2), 3);
  CHECK_EQ(roce::Config::workersAuto(32, 1), 8);
  CHECK_EQ(roce::Config::workersAuto(3, 4), 1);
  const int cpus = roce::Config::usableCpus();
  CHECK_GE(cpus, 1);
}
