"""python -m roce_pg.doctor trace DIR: reads the flight-recorder dumps of a job
(roce_pg.dump_trace(), or ROCE_PG_TRACE_DUMP=PREFIX on failure: one file per
rank and group, PREFIX<rank>_<group>.json, JSON or pickle) and prints, per
group:

  * which ranks left no dump (a rank that was not inside a collective when the
    group broke writes none; neither does a dead one);
  * the first divergence: the first collective whose op, sizes or dtypes
    differ between ranks, or that some ranks entered and others did not;
  * stragglers: the rank that issued each collective last, counted over the
    collectives every rank recorded (issue times are wall-clock: across
    machines they are as good as the clocks' synchronisation);
  * the slowest operations;
  * what each rank's process refused or dropped of what reached it over the
    network (strangers without the job secret, forged records, budgets
    exceeded: roce_pg.counters()'s net_* counts when the dump was written).

Exit status: 0 when the dumps agree, 1 when a divergence or a missing rank
was found (refusals from the network are listed, not counted), 2 when there
is nothing to read. No torch import: it runs anywhere.
"""
import argparse
import json
import os
import pickle
import re
import sys
from collections import defaultdict




def _load(path):
    with open(path, "rb") as f:
        head = f.read(1)
        f.seek(0)
        if head in (b"{", b"["):
            return json.load(f)
        return pickle.load(f)


def load_dumps(directory, prefix):
    """{group name: {rank: dump}} from the files in `directory` named PREFIX<rank>_<group>[.json]."""
    groups = defaultdict(dict)
    for name in sorted(os.listdir(directory)):
        if not name.startswith(prefix):
            continue
        m = re.fullmatch(r"(\d+)_(.*?)(\.json|\.pkl|\.pickle)?", name[len(prefix):])
        if not m:
            continue
        try:
            dump = _load(os.path.join(directory, name))
        except Exception as e:  # noqa: BLE001 - a broken file is reported, not fatal
            print(f"{name}: unreadable ({e})", file=sys.stderr)
            continue
        rank = int(m.group(1))
        for entry_group, cfg in (dump.get("pg_config") or {m.group(2): {}}).items():
            groups[cfg.get("name", entry_group) if isinstance(cfg, dict) else entry_group][rank] = dump
    return groups


def _members(dumps):
    for dump in dumps.values():
        for cfg in (dump.get("pg_config") or {}).values():
            try:
                return sorted(json.loads(cfg["ranks"]) if isinstance(cfg.get("ranks"), str) else cfg["ranks"])
            except (KeyError, TypeError, ValueError):
                pass
    return sorted(dumps)


def _collectives(dump):
    return {e["collective_seq_id"]: e for e in dump.get("entries", []) if not e.get("is_p2p")}


def _signature(e):
    return (e.get("profiling_name"), json.dumps(e.get("input_sizes")), json.dumps(e.get("input_dtypes")))


def _describe(e):
    name = (e.get("profiling_name") or "?").split(":")[-1]
    return f"{name} {e.get('input_sizes')} {','.join(e.get('input_dtypes') or [])}"


def rank_list(ranks):
    """"0-3, 5, 7-9": ascending, runs of three or more collapsed (as the extension's verdicts write them)."""
    ranks, parts, i = sorted(ranks), [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(f"{ranks[i]}-{ranks[j]}" if j >= i + 2 else ", ".join(map(str, ranks[i:j + 1])))
        i = j + 1
    return ", ".join(parts)


def _ranks(ranks):
    return ("rank " if len(ranks) == 1 else "ranks ") + rank_list(ranks)


def first_divergence(dumps):
    """The first collective (by sequence number) the ranks disagree on, as text, or None."""
    per_rank = {r: _collectives(d) for r, d in dumps.items()}
    first = min((min(c) for c in per_rank.values() if c), default=None)
    if first is None:
        return None
    last = max(max(c) for c in per_rank.values() if c)
    for seq in range(first, last + 1):
        present = {r: c[seq] for r, c in per_rank.items() if seq in c}
        # A rank whose ring no longer holds seq (it wrapped) is not evidence of absence.
        absent = [r for r, c in per_rank.items() if seq not in c and c and max(c) < seq]
        by_signature = defaultdict(list)
        for r, e in present.items():
            by_signature[_signature(e)].append(r)
        if len(by_signature) > 1:
            calls = "; ".join(f"{_ranks(rs)} called {_describe(present[rs[0]])}"
                              for rs in sorted(by_signature.values(), key=lambda rs: rs[0]))
            return f"collective #{seq} differs: {calls}"
        if absent:
            e = next(iter(present.values()))
            lasts = defaultdict(list)
            for r in absent:
                c = per_rank[r]
                lasts[max(c)].append(r)
            behind = "; ".join(f"{_ranks(rs)} last recorded #{s} ({_describe(per_rank[rs[0]][s])}, "
                               f"{per_rank[rs[0]][s].get('state')})" for s, rs in sorted(lasts.items()))
            return f"collective #{seq} ({_describe(e)}) was entered by {_ranks(present)} but not by others: {behind}"
    return None


def stragglers(dumps):
    """[(rank, times last, mean lag ms)] over the collectives every rank recorded, most often last first."""
    per_rank = {r: _collectives(d) for r, d in dumps.items()}
    if len(per_rank) < 2:
        return [], 0
    common = set.intersection(*(set(c) for c in per_rank.values()))
    last_count, lag_sum = defaultdict(int), defaultdict(float)
    counted = 0
    for seq in common:
        created = {r: c[seq].get("time_created_ns") for r, c in per_rank.items()}
        if any(v is None for v in created.values()):
            continue
        counted += 1
        latest = max(created, key=created.get)
        last_count[latest] += 1
        lag_sum[latest] += (created[latest] - min(created.values())) / 1e6
    rows = [(r, n, lag_sum[r] / n) for r, n in last_count.items()]
    return sorted(rows, key=lambda x: (-x[1], x[0])), counted


def slowest(dumps, top):
    ops = []
    for r, d in dumps.items():
        for e in d.get("entries", []):
            if e.get("duration_ms") is not None:
                ops.append((e["duration_ms"], r, e))
    return sorted(ops, key=lambda x: -x[0])[:top]


# roce_pg.counters()'s net_* names, as the report words them.
_REFUSALS = {
    "net_unauthenticated": "connections not signed with the job secret",
    "net_refused_busy": "connections closed unread (too many heads pending)",
    "net_links_refused": "process links refused",
    "net_records_dropped": "lifeline records dropped (parking budget)",
    "net_records_misrouted": "lifeline records naming another process's rank",
    "net_records_forged": "forged process-link records",
    "net_streams_refused": "TCP streams refused (parked stream budget)",
}


def network_refusals(groups):
    """{rank: {counter: count}} of the non-zero refusal counts in the dumps.
    The counts are the process's, shared by its groups: the largest seen in
    any of a rank's dumps (they only grow) is its latest."""
    per_rank = defaultdict(dict)
    for dumps in groups.values():
        for rank, dump in dumps.items():
            for name, count in (dump.get("roce_network") or {}).items():
                if isinstance(count, int) and count > 0:
                    per_rank[rank][name] = max(count, per_rank[rank].get(name, 0))
    return dict(per_rank)


def _print_refusals(groups, out):
    refusals = network_refusals(groups)
    if not refusals:
        return
    print("refused from the network (each rank's process, when it wrote its dump; see README, "
          "\"Who can reach a rank\"):", file=out)
    for rank, counts in sorted(refusals.items()):
        words = ", ".join(f"{n} {_REFUSALS.get(name, name)}" for name, n in sorted(counts.items()))
        print(f"  rank {rank}: {words}", file=out)


def report(directory, prefix="roce_trace_", top=5, out=sys.stdout):
    groups = load_dumps(directory, prefix)
    if not groups:
        print(f"no dumps named {prefix}<rank>_<group>[.json] in {directory}", file=out)
        return 2
    found = False
    _print_refusals(groups, out)
    for name, dumps in sorted(groups.items()):
        members = _members(dumps)
        print(f"group {name}: dumps from {_ranks(dumps)} of {len(members)} ranks", file=out)
        missing = [r for r in members if r not in dumps]
        if missing:
            found = True
            print(f"  no dump from {_ranks(missing)}: not inside a collective when the group broke (alive but "
                  f"not calling, the usual culprit of a hang), or dead", file=out)
        # The first failure of each rank; ranks that failed alike are listed once.
        failures = defaultdict(list)
        for r, d in sorted(dumps.items()):
            e = next((e for e in d.get("entries", []) if e.get("error")), None)
            if e:
                same = re.sub(r"\bon rank \d+", "on rank R", e["error"])
                failures[same].append((r, e))
        for text, where in failures.items():
            r, e = where[0]
            also = f" ({_ranks([x for x, _ in where[1:]])} alike)" if len(where) > 1 else ""
            print(f"  rank {r}: #{e.get('collective_seq_id')} failed{also}: {e['error']}", file=out)
        divergence = first_divergence(dumps)
        if divergence:
            found = True
            print(f"  first divergence: {divergence}", file=out)
        else:
            print("  first divergence: none (every rank recorded the same collectives)", file=out)
        rows, counted = stragglers(dumps)
        if rows:
            print(f"  issued last, over {counted} collectives every rank recorded:", file=out)
            for r, n, lag in rows[:top]:
                print(f"    rank {r}: last in {n} ({100 * n / counted:.0f}%), on average {lag:.3f} ms after the first",
                      file=out)
        print("  slowest operations:", file=out)
        for ms, r, e in slowest(dumps, top):
            print(f"    {ms:10.3f} ms  rank {r}  #{e.get('collective_seq_id')} {_describe(e)} "
                  f"({e.get('algorithm') or '-'}, {e.get('state')})", file=out)
    return 1 if found else 0


def main(argv):
    ap = argparse.ArgumentParser(prog="python -m roce_pg.doctor trace", description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", help="the directory holding the dumps")
    ap.add_argument("--prefix", default="roce_trace_", help="file name prefix (default roce_trace_)")
    ap.add_argument("--top", type=int, default=5, help="slowest operations and stragglers to list (5)")
    args = ap.parse_args(argv)
    if not os.path.isdir(args.dir):
        print(f"{args.dir}: not a directory", file=sys.stderr)
        return 2
    return report(args.dir, args.prefix, args.top)
