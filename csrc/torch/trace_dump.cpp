#include "trace_dump.hpp"

#include <c10/core/ScalarType.h>
#include <cstdint>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <string_view>
#include <unistd.h>

namespace roce::adapter {
namespace {

// roce's operation titles as torch's analyzer spells them (the names torch's
// FlightRecorderHook writes; an unknown name makes the analyzer reject the
// entry).
std::string_view torchOpName(std::string_view title) {
  static constexpr std::pair<std::string_view, std::string_view> kRenamed[] = {
      {"allreduce", "all_reduce"},
      {"allreduce (sparse)", "all_reduce"},
      {"allgather", "all_gather"},
      {"all_gather_into_tensor", "_all_gather_base"},
      {"allgather_into_tensor_coalesced", "all_gather_into_tensor_coalesced"},
      {"reduce_scatter_tensor", "_reduce_scatter_base"},
  };
  for (const auto& [ours, theirs] : kRenamed)
    if (title == ours) return theirs;
  return title;  // the others are spelled alike
}

void quote(std::string& out, std::string_view s) {
  out += '"';
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

// `"key": ` with the key quoted.
void key(std::string& out, std::string_view k) {
  quote(out, k);
  out += ": ";
}

void number(std::string& out, std::string_view k, long long v) {
  key(out, k);
  out += std::to_string(v);
  out += ", ";
}

// [[elems]] and ["Float"] for a buffer of known type, [] and [] otherwise.
void tensors(std::string& out, std::string_view sizesKey, std::string_view dtypesKey, uint64_t elems, int16_t dtype) {
  key(out, sizesKey);
  out += dtype < 0 ? "[]" : "[[" + std::to_string(elems) + "]]";
  out += ", ";
  key(out, dtypesKey);
  if (dtype < 0) {
    out += "[]";
  } else {
    out += '[';
    quote(out, c10::toString(static_cast<c10::ScalarType>(dtype)));
    out += ']';
  }
  out += ", ";
}

}  // namespace

std::string traceDumpJson(const TraceRing& ring, const TraceDumpGroup& g) {
  std::vector<std::string> reasons;
  const auto entries = ring.snapshot(&reasons);
  // The ring's times are CLOCK_MONOTONIC; torch's dumps carry wall-clock ns.
  const int64_t wallMinusMono =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count() -
      TraceRing::nowNs();
  auto wall = [&](int64_t mono) { return mono + wallMinusMono; };

  std::string out = "{";
  key(out, "version");
  out += "\"2.10\", ";
  key(out, "comm_lib_version");
  out += "\"roce\", ";
  key(out, "pg_config");
  out += '{';
  key(out, g.name);
  out += '{';
  key(out, "name");
  quote(out, g.name);
  out += ", ";
  key(out, "desc");
  quote(out, g.desc);
  out += ", ";
  key(out, "ranks");
  std::string ranks = "[";
  for (size_t i = 0; i < g.ranks.size(); ++i) ranks += (i ? ", " : "") + std::to_string(g.ranks[i]);
  quote(out, ranks + "]");
  out += "}}, ";

  // What torch's pg_status says: the last collective enqueued, started and completed.
  long long enqueued = -1, started = -1, completed = -1;
  for (const auto& e : entries) {
    if (e.p2p) continue;
    enqueued = std::max<long long>(enqueued, e.collectiveSeq);
    if (e.startNs) started = std::max<long long>(started, e.collectiveSeq);
    if (e.state == TraceState::Completed) completed = std::max<long long>(completed, e.collectiveSeq);
  }
  key(out, "pg_status");
  out += '{';
  key(out, g.name);
  out += '{';
  number(out, "last_enqueued_collective", enqueued);
  number(out, "last_started_collective", started);
  key(out, "last_completed_collective");
  out += std::to_string(completed) + "}}, ";

  key(out, "roce_network");
  out += '{';
  for (size_t i = 0; i < g.network.size(); ++i) {
    if (i) out += ", ";
    key(out, g.network[i].first);
    out += std::to_string(g.network[i].second);
  }
  out += "}, ";

  key(out, "entries");
  out += '[';
  for (size_t i = 0; i < entries.size(); ++i) {
    const TraceEntry& e = entries[i];
    out += i ? ", {" : "{";
    number(out, "record_id", static_cast<long long>(e.pos - 1));  // torch counts from 0
    number(out, "pg_id", 0);
    key(out, "process_group");
    out += '[';
    quote(out, g.name);
    out += ", ";
    quote(out, g.desc);
    out += "], ";
    number(out, "collective_seq_id", static_cast<long long>(e.collectiveSeq));
    number(out, "p2p_seq_id", static_cast<long long>(e.p2pSeq));
    number(out, "op_id", static_cast<long long>(e.seq));
    std::string name = std::string("roce:") + std::string(torchOpName(e.op));
    if (e.p2p) {
      const std::string peer = e.peer >= 0 ? std::to_string(e.peer) : "?";
      name += " " + std::to_string(g.rank) + (std::strcmp(e.op, "send") == 0 ? "->" : "<-") + peer;
    }
    key(out, "profiling_name");
    quote(out, name);
    out += ", ";
    number(out, "time_created_ns", wall(e.enqueueNs));
    if (e.state == TraceState::Completed) {
      key(out, "duration_ms");
      out += std::to_string(static_cast<double>(e.endNs - e.startNs) / 1e6) + ", ";
    }
    number(out, "timeout_ms", e.timeoutMs);
    key(out, "is_p2p");
    out += e.p2p ? "true, " : "false, ";
    tensors(out, "input_sizes", "input_dtypes", e.inElems, e.inDtype);
    tensors(out, "output_sizes", "output_dtypes", e.outElems, e.outDtype);
    // torch has no "failed": an entry retired without completing is one that
    // never finished; roce's reason goes in "error".
    const bool done = e.state == TraceState::Completed || e.state == TraceState::Failed;
    key(out, "state");
    quote(out, e.state == TraceState::Completed ? "completed" : e.startNs ? "started" : "scheduled");
    out += ", ";
    key(out, "time_discovered_started_ns");
    out += e.startNs ? std::to_string(wall(e.startNs)) : "null";
    out += ", ";
    key(out, "time_discovered_completed_ns");
    out += e.state == TraceState::Completed ? std::to_string(wall(e.endNs)) : "null";
    out += ", ";
    key(out, "retired");
    out += done ? "true, " : "false, ";
    key(out, "frames");
    out += "[], ";
    key(out, "algorithm");
    if (e.algo) quote(out, e.algo);
    else out += "null";
    out += ", ";
    number(out, "peer", e.peer);
    number(out, "tag", e.tag);
    number(out, "bytes", static_cast<long long>(e.bytes));
    key(out, "error");
    if (e.state == TraceState::Failed) quote(out, reasons[i]);
    else out += "null";
    out += '}';
  }
  out += "]}";
  return out;
}

bool writeTraceDump(const std::string& path, const TraceRing& ring, const TraceDumpGroup& group, std::string* why) {
  // A name nobody can guess, created exclusively (mkstemp: O_CREAT|O_EXCL,
  // mode 0600): a dump prefix in a shared directory such as /tmp must not let
  // another user plant a symlink that the write would follow. rename() then
  // replaces whatever is at `path`, a symlink included, without following it.
  std::string tmp = path + ".XXXXXX";
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) {
    *why = "cannot create a file beside " + path + ": " + std::strerror(errno);
    return false;
  }
  const std::string json = traceDumpJson(ring, group);
  size_t done = 0;
  while (done < json.size()) {
    const ssize_t n = ::write(fd, json.data() + done, json.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *why = "cannot write " + tmp + ": " + std::strerror(errno);
      ::close(fd);
      std::remove(tmp.c_str());
      return false;
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    *why = "cannot rename " + tmp + " to " + path + ": " + std::strerror(errno);
    std::remove(tmp.c_str());
    return false;
  }
  return true;
}

}  // namespace roce::adapter
