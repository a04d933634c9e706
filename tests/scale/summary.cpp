#include "summary.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>

namespace scale {
namespace {

constexpr double kMiB = double(1u << 20);

struct Spread {
  double min = 0, median = 0, max = 0;
  int ranks = 0;  // that reported the metric
};

Spread spreadOf(const RunResult& r, const std::string& metric) {
  std::vector<double> v;
  for (const auto& rep : r.reports)
    if (rep)
      if (auto it = rep->metrics.find(metric); it != rep->metrics.end()) v.push_back(it->second);
  Spread s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  s = {v.front(), n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2, v.back(), static_cast<int>(n)};
  return s;
}

void row(const RunResult& r, const std::string& metric, const std::string& label, double scale = 1) {
  const Spread s = spreadOf(r, metric);
  if (s.ranks == 0) return;
  std::printf("  %-46s %12.4g %12.4g %12.4g\n", label.c_str(), s.min * scale, s.median * scale, s.max * scale);
}

std::string layoutLabel(const Options& o) {
  if (std::all_of(o.machines.begin(), o.machines.end(), [&](int m) { return m == o.machines[0]; }))
    return std::to_string(o.machines.size()) + " x " + std::to_string(o.machines[0]);
  std::string s;
  for (int m : o.machines) s += (s.empty() ? "" : ",") + std::to_string(m);
  return s;
}

void printTimes(const Options& o, const RunResult& r) {
  if (o.sizes.empty() || o.allreduceAlgos.empty()) return;
  std::printf("\nallreduce, ms per call (median / max over ranks):\n  %-14s", "algorithm");
  for (size_t b : o.sizes) std::printf(" %21s", bytesLabel(b).c_str());
  std::printf("\n");
  for (const auto& algo : o.allreduceAlgos) {
    std::printf("  %-14s", algo.c_str());
    for (size_t b : o.sizes) {
      const Spread s = spreadOf(r, "allreduce_" + algo + "_" + std::to_string(b));
      char cell[64];
      std::snprintf(cell, sizeof cell, "%.3g / %.3g", s.median * 1e3, s.max * 1e3);
      std::printf(" %21s", s.ranks ? cell : "-");
    }
    std::printf("\n");
  }
}

void writeString(std::ostream& out, const std::string& s) {
  out << '"';
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out << '\\' << ch;
    else if (static_cast<unsigned char>(ch) < 0x20) out << ' ';
    else out << ch;
  }
  out << '"';
}

void writeStrings(std::ostream& out, const std::vector<std::string>& list) {
  out << '[';
  for (size_t i = 0; i < list.size(); ++i) {
    if (i) out << ", ";
    writeString(out, list[i]);
  }
  out << ']';
}

}  // namespace

void printSummary(const Options& o, const RunResult& r) {
  int reported = 0, minChecks = -1, maxChecks = 0;
  for (const auto& rep : r.reports)
    if (rep) {
      ++reported;
      minChecks = minChecks < 0 ? rep->checksPassed : std::min(minChecks, rep->checksPassed);
      maxChecks = std::max(maxChecks, rep->checksPassed);
    }
  std::printf("roce_scale: %d ranks on %zu simulated machines (%s); TCP between machines, shared memory inside\n",
              o.ranks, o.machines.size(), layoutLabel(o).c_str());
  std::printf("checks passed per rank: %d to %d (%d of %d ranks reported)\n\n", std::max(minChecks, 0), maxChecks,
              reported, o.ranks);
  std::printf("  %-46s %12s %12s %12s\n", "per rank", "min", "median", "max");
  row(r, "init_s", "init: store barrier -> Communicator (s)");
  row(r, "reinit_max_s", "slowest re-formation of a group (s)");
  row(r, "rss_init_kib", "RSS right after init (MiB)", 1.0 / 1024);
  row(r, "pss_init_kib", "PSS right after init (MiB)", 1.0 / 1024);
  row(r, "rss_kib", "RSS (MiB)", 1.0 / 1024);
  row(r, "pss_kib", "PSS (MiB)", 1.0 / 1024);
  row(r, "shm_segment_kib", "own shared-memory segment (MiB)", 1.0 / 1024);
  row(r, "peak_rss_kib", "peak RSS over the run (MiB)", 1.0 / 1024);
  row(r, "fds", "descriptors");
  row(r, "fds_peak", "descriptors, peak");
  row(r, "threads", "threads");
  row(r, "threads_peak", "threads, peak");
  row(r, "connections", "network connections");
  row(r, "verbs_bytes", "  verbs registered at that count (MiB)", 1 / kMiB);
  row(r, "connections_peak", "network connections, most in any group");
  row(r, "verbs_bytes_peak", "  verbs registered at that count (MiB)", 1 / kMiB);
  row(r, "connections_all_peers", "network connections after all-peer collectives");
  row(r, "verbs_bytes_all_peers", "  verbs registered at that count (MiB)", 1 / kMiB);
  for (const auto& algo : o.allreduceAlgos) row(r, "connections_allreduce_" + algo, "connections, allreduce " + algo);
  for (const auto& algo : o.gatherAlgos) row(r, "connections_allgather_" + algo, "connections, allgather " + algo);
  std::printf("  (RSS, PSS, descriptors, threads, connections: in the default group %s;\n"
              "   verbs: projected from the pool sizes, roce::transport::verbs::verbsRegisteredBytes; a group's connections:\n"
              "   after its checks, or with --checks none after its timings)\n",
              o.checks == Options::Checks::None ? "right after init" : "once its few-peer collectives ran");
  std::printf("\nstore, whole run: %llu requests (%.1f per rank), %.2f MiB received, %.2f MiB sent (%.1f KiB per rank)\n",
              static_cast<unsigned long long>(r.storeRequests), double(r.storeRequests) / o.ranks,
              r.storeBytesIn / kMiB, r.storeBytesOut / kMiB, r.storeBytesOut / 1024.0 / o.ranks);
  printTimes(o, r);
  for (const auto& note : r.notes) std::printf("note: %s\n", note.c_str());
  for (const auto& p : r.problems) std::printf("FAILED: %s\n", p.c_str());
  std::printf("%s\n", r.ok() ? "all ranks passed" : "the run FAILED");
}

void writeJson(const Options& o, const RunResult& r, const std::string& path) {
  std::ofstream out(path);
  out.precision(12);
  std::set<std::string> metrics;
  for (const auto& rep : r.reports)
    if (rep)
      for (const auto& [name, v] : rep->metrics) metrics.insert(name);
  out << "{\"ranks\": " << o.ranks << ", \"machines\": [";
  for (size_t i = 0; i < o.machines.size(); ++i) out << (i ? ", " : "") << o.machines[i];
  out << "], \"ok\": " << (r.ok() ? "true" : "false") << ", \"problems\": ";
  writeStrings(out, r.problems);
  out << ", \"notes\": ";
  writeStrings(out, r.notes);
  out << ", \"sizes\": [";
  for (size_t i = 0; i < o.sizes.size(); ++i) out << (i ? ", " : "") << o.sizes[i];
  out << "], \"allreduce_algos\": ";
  writeStrings(out, o.allreduceAlgos);
  out << ", \"gather_algos\": ";
  writeStrings(out, o.gatherAlgos);
  out << ", \"checks_passed\": [";
  for (size_t i = 0; i < r.reports.size(); ++i) out << (i ? ", " : "") << (r.reports[i] ? r.reports[i]->checksPassed : 0);
  out << "], \"store\": {\"requests\": " << r.storeRequests << ", \"bytes_in\": " << r.storeBytesIn
      << ", \"bytes_out\": " << r.storeBytesOut << "}, \"errors\": [";
  for (size_t i = 0; i < r.reports.size(); ++i) {
    out << (i ? ", " : "");
    if (r.reports[i] && !r.reports[i]->error.empty()) writeString(out, r.reports[i]->error);
    else out << "null";
  }
  out << "], \"metrics\": {";
  bool first = true;
  for (const auto& name : metrics) {
    out << (first ? "" : ", ") << "\n  ";
    first = false;
    writeString(out, name);
    out << ": [";
    for (size_t i = 0; i < r.reports.size(); ++i) {
      out << (i ? ", " : "");
      const auto* rep = r.reports[i] ? &*r.reports[i] : nullptr;
      auto it = rep ? rep->metrics.find(name) : std::map<std::string, double>::const_iterator();
      if (rep && it != rep->metrics.end()) out << it->second;
      else out << "null";
    }
    out << "]";
  }
  out << "\n}}\n";
}

}  // namespace scale
