#!/bin/bash
# Guest-side measurements for ONE Soft-RoCE VM (rxe0 on dummy0, 10.99.0.1).
#   scripts/softroce/run_vm.sh 'bash scripts/softroce/measure_one_vm.sh'
# ITERS (default 200) 1 MiB ib_write_bw iterations; PY (default /work/main/.venv/bin/python).
set -u
PY="${PY:-$(cd "$(dirname "$0")/../.." && pwd)/.venv/bin/python}"
ITERS="${ITERS:-200}"
HC=/sys/class/infiniband/rxe0/ports/1/hw_counters
echo "== uptime at start: $(cut -d' ' -f1 /proc/uptime) s; nproc=$(nproc); ulimit -l=$(ulimit -l)"

echo "== GID table: gid_tbl_len=$(ls /sys/class/infiniband/rxe0/ports/1/gids | wc -l); non-zero entries (gids/N, gid_attrs/types/N, gid_attrs/ndevs/N):"
t0="$(date +%s.%N)"
echo "== show_gids.sh (sysfs)"; bash "$(dirname "$0")/show_gids.sh" rxe0
t1="$(date +%s.%N)"; echo "   (show_gids.sh took $(awk "BEGIN{print $t1-$t0}")s)"
echo "== ibv_devinfo -v GIDs"; ibv_devinfo -v -d rxe0 | grep -i gid
echo "== hw_counters files"; ls "$HC"

snap() { for f in sent_pkts rcvd_pkts; do printf '%s=%s ' "$f" "$(cat "$HC/$f")"; done; echo; }

bw() {  # bw LABEL ib_write_bw-args...
  local label="$1"; shift
  local before; before="$(cat "$HC/sent_pkts")"
  ib_write_bw -d rxe0 -x 1 -F -p 18600 "$@" >/tmp/srv.log 2>&1 &
  local spid=$!
  sleep 2
  local t0; t0="$(date +%s.%N)"
  ib_write_bw -d rxe0 -x 1 -F -p 18600 "$@" 10.99.0.1 >/tmp/cli.log 2>&1
  local crc=$?
  wait "$spid"; local src=$?
  local t1; t1="$(date +%s.%N)"
  local after; after="$(cat "$HC/sent_pkts")"
  echo "== ib_write_bw $label ($*): client rc=$crc server rc=$src wall=$(awk "BEGIN{print $t1-$t0}")s sent_pkts $before -> $after (+$((after-before)))"
  grep -A2 -E '#bytes' /tmp/cli.log | sed 's/^/   client| /'
  grep -A2 -E '#bytes' /tmp/srv.log | sed 's/^/   server| /'
  [[ $crc == 0 ]] || tail -20 /tmp/cli.log
}

echo "== counters before: $(snap)"
bw "1MiB unidirectional" -s 1048576 -n "$ITERS"
bw "1MiB bidirectional" -s 1048576 -n "$ITERS" -b
echo "== counters after: $(snap)"

if [[ -n "${SKIP_TORCH:-}" ]]; then echo "== uptime at end: $(cut -d' ' -f1 /proc/uptime) s"; exit 0; fi
echo "== import torch"
t0="$(date +%s.%N)"; "$PY" -c "import torch" ; rc=$?; t1="$(date +%s.%N)"
echo "   rc=$rc time=$(awk "BEGIN{print $t1-$t0}")s"
echo "== import torch (second time, page cache warm)"
t0="$(date +%s.%N)"; "$PY" -c "import torch" ; rc=$?; t1="$(date +%s.%N)"
echo "   rc=$rc time=$(awk "BEGIN{print $t1-$t0}")s"
echo "== roce_pg.rdma_ports()"
t0="$(date +%s.%N)"
"$PY" -c "import roce_pg; print(roce_pg.rdma_ports())"; rc=$?
t1="$(date +%s.%N)"; echo "   rc=$rc time=$(awk "BEGIN{print $t1-$t0}")s"
echo "== uptime at end: $(cut -d' ' -f1 /proc/uptime) s"
