#include "options.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "../../csrc/common/parse.hpp"

namespace scale {
namespace {

const char* kUsage = R"(usage: roce_scale --layout LAYOUT [options]

Runs a roce group of torch-free ranks (forked processes) on this machine:
simulated machines with TCP between them and shared memory inside, a store
served by this process, correctness checks of every collective and algorithm,
and per-rank measurements (init time, RSS/PSS, descriptors, threads,
connections, projected verbs memory, allreduce times).

  --layout MxL | L1,L2,...  M machines of L ranks, or the ranks of each machine
  --checks full|few|none    few: skip the large reduce, gather, scatter and
                            alltoallv, whose root or every rank talks to all
                            others; none: check only the timed allreduces'
                            results, measure resources right after init and
                            form no allgather groups (default full)
  --algos A,B,...           allreduce algorithms, each in a group of its own
                            (default rd,rabenseifner,ring,tree,hier,auto)
  --gather-algos A,B,...    allgather/reduce_scatter algorithms (default ring,bruck,hier)
  --sizes S,...             timed allreduce sizes, K/M suffixes (default 8,1M,32M)
                            (each list: "none" for no item)
  --iterations N            most calls per timed size (default 20 / 5 / 2 by size)
  --budget S                about how long each timed size may take: fewer
                            calls when one is slow (default 5)
  --time-limit S            wall clock for the whole run; ranks still running
                            then are killed and named (default 300)
  --memory-share F          share of MemAvailable the timed buffers may use (default 0.5)
  --json PATH               write per-rank results there
Environment: ROCE_PG_* as for the backend (the harness sets
ROCE_PG_NET_TRANSPORT=tcp and 64 KiB shared-memory rings and slots unless set).
)";

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "roce_scale: %s\n\n%s", why.c_str(), kUsage);
  std::exit(2);
}

// "none" is the empty list.
std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  if (s == "none") return out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, sep);) out.push_back(item);
  return out;
}

uint64_t number(const std::string& s, const char* what, uint64_t lo, uint64_t hi) {
  uint64_t v;
  if (!roce::parseU64(s, lo, hi, v)) usage(std::string("bad ") + what + ": " + s);
  return v;
}

size_t byteSize(std::string s) {
  size_t unit = 1;
  if (!s.empty() && (s.back() == 'K' || s.back() == 'M')) {
    unit = s.back() == 'K' ? 1u << 10 : 1u << 20;
    s.pop_back();
  }
  return number(s, "size", 1, uint64_t(1) << 34) * unit;
}

std::vector<int> layout(const std::string& s) {
  std::vector<int> machines;
  if (auto x = s.find('x'); x != std::string::npos) {
    const int count = static_cast<int>(number(s.substr(0, x), "machine count", 1, 1 << 16));
    machines.assign(count, static_cast<int>(number(s.substr(x + 1), "ranks per machine", 1, 1 << 16)));
  } else {
    for (const auto& part : split(s, ','))
      machines.push_back(static_cast<int>(number(part, "ranks on a machine", 1, 1 << 16)));
  }
  return machines;
}

void requireAmong(const std::vector<std::string>& names, const std::vector<std::string>& allowed, const char* flag) {
  for (const auto& n : names) {
    bool ok = false;
    for (const auto& a : allowed) ok = ok || n == a;
    if (!ok) usage(std::string("unknown algorithm for ") + flag + ": " + n);
  }
}

}  // namespace

int Options::machineOf(int rank) const {
  for (int m = 0; m < static_cast<int>(machines.size()); ++m) {
    if (rank < machines[m]) return m;
    rank -= machines[m];
  }
  return -1;
}

Options parseOptions(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (i + 1 >= argc) usage(flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--layout") o.machines = layout(value);
    else if (flag == "--checks" && value == "full") o.checks = Options::Checks::Full;
    else if (flag == "--checks" && value == "few") o.checks = Options::Checks::Few;
    else if (flag == "--checks" && value == "none") o.checks = Options::Checks::None;
    else if (flag == "--algos") o.allreduceAlgos = split(value, ',');
    else if (flag == "--gather-algos") o.gatherAlgos = split(value, ',');
    else if (flag == "--sizes") {
      o.sizes.clear();
      for (const auto& s : split(value, ',')) o.sizes.push_back(byteSize(s));
    } else if (flag == "--iterations") o.iterations = static_cast<int>(number(value, "iteration count", 1, 100000));
    else if (flag == "--budget") o.budgetS = static_cast<int>(number(value, "budget", 1, 3600));
    else if (flag == "--time-limit") o.timeLimitS = static_cast<int>(number(value, "time limit", 10, 86400));
    else if (flag == "--memory-share") o.memoryShare = std::atof(value.c_str());
    else if (flag == "--json") o.jsonPath = value;
    else usage("unknown option or value: " + flag + " " + value);
  }
  if (o.machines.empty()) usage("--layout is required");
  for (int m : o.machines) o.ranks += m;
  if (o.ranks < 2) usage("a group needs at least 2 ranks");
  requireAmong(o.allreduceAlgos, {"auto", "rd", "rabenseifner", "ring", "tree", "hier"}, "--algos");
  requireAmong(o.gatherAlgos, {"auto", "ring", "bruck", "hier"}, "--gather-algos");
  if (!(o.memoryShare > 0 && o.memoryShare <= 1)) usage("--memory-share must be in (0, 1]");
  return o;
}

std::string bytesLabel(size_t bytes) {
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= (1u << 10) && bytes % (1u << 10) == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

}  // namespace scale
