#!/usr/bin/env bash
# Boots TWO Soft-RoCE VMs joined by a private Ethernet link (QEMU socket netdev on
# 127.0.0.1:<random free port>) and runs a command on each; waits for both.
#   scripts/softroce/run_two_vms.sh 'CMD FOR NODE 0' ['CMD FOR NODE 1']
# (one command: both nodes run it and tell themselves apart by $NODE_RANK).
# Node r (r = 0, 1): hostname softroce-node<r>, virtio NIC MAC 52:54:00:77:00:0<r+1> with
# 10.77.0.<r+1>/24, rxe0 on that NIC. Guest env: NODE_RANK, NODE_ADDR, PEER_ADDR,
# SOFTROCE_NETDEV (the NIC's name), SOFTROCE_RDMA_DEV=rxe0, plus SOFTROCE_PASS_ENV names.
# Before the command each node waits (ping, at most SOFTROCE_PEER_WAIT=600 s) until the
# peer answers. $SOFTROCE_SHARED_DIR is a host directory both guests can write.
# Env: SOFTROCE_CPUS (per VM, default 1) SOFTROCE_MEM (per VM, 4G)
#      SOFTROCE_TIMEOUT (1800 s, hard wall clock per VM) SOFTROCE_PORT (random)
#      SOFTROCE_PEER_GRACE (60 s: after one node fails, how long the other may go on)
#      SOFTROCE_KERNEL SOFTROCE_VERBOSE=1 SOFTROCE_KEEP=1
# Exit status: 0 if both commands exited 0; else the status of the node that failed first
# (124 = timeout, 86 = VM or RDMA setup failed; 143 = stopped after its peer failed).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=common.sh
source "$HERE/common.sh"
[[ $# -ge 1 && $# -le 2 ]] || { sed -n '2,17p' "$0" >&2; exit 2; }
softroce_check
export SOFTROCE_CPUS="${SOFTROCE_CPUS:-1}"
CMD0="$1"; CMD1="${2:-$1}"
TMO="${SOFTROCE_TIMEOUT:-1800}"

free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
PORT="${SOFTROCE_PORT:-$(free_port)}"
ADDR=(10.77.0.1 10.77.0.2)
MAC=(52:54:00:77:00:01 52:54:00:77:00:02)
NETOPT=("listen=127.0.0.1:$PORT" "connect=127.0.0.1:$PORT")
CMDS=("$CMD0" "$CMD1")
W=(); PID=()

start_node() {
  local r="$1" name="softroce-node$1" w
  w="$(softroce_prepare_workdir "$name" nic "${ADDR[r]}" "${ADDR[1-r]}" "$r" "${MAC[r]}" "${CMDS[r]}")"
  W[r]="$w"
  SOFTROCE_WORKDIRS+=("$w")
  softroce_vng_args "$name" "$w" --no-dhcp --rwdir "$SOFTROCE_SHARED_DIR" \
    --qemu-opts="-netdev socket,id=rxenet,${NETOPT[r]} -device virtio-net-pci,netdev=rxenet,mac=${MAC[r]}"
  # Pipes, not files, for QEMU's stdout/stderr (it opens /proc/self/fd/N with O_TRUNC).
  timeout --kill-after=20 "$TMO" "$VNG" "${VNG_ARGS[@]}" </dev/null \
    > >(sed -u "s/^/[node$r] /") 2> >(sed -u "s/^/[node$r] /" >&2) &
  PID[r]=$!
  SOFTROCE_PIDS+=("$!")
}

# A directory both guests can write (9p --rwdir on each): readiness/done markers, and
# scratch space for the guest commands ($SOFTROCE_SHARED_DIR in the guest).
SOFTROCE_SHARED_DIR="$(mktemp -d "${SOFTROCE_TMP:-/tmp}/softroce-pair.XXXXXX")"
export SOFTROCE_SHARED_DIR
SOFTROCE_WORKDIRS+=("$SOFTROCE_SHARED_DIR")
softroce_trap_signals
start_node 0
# node 1 may only connect once node 0's QEMU listens (a refused connect ends QEMU).
# Poll with ss: a test connection would be accepted by QEMU as the peer.
for _ in $(seq 1 600); do
  ss -Hltn "sport = :$PORT" 2>/dev/null | grep -q . && break
  kill -0 "${PID[0]}" 2>/dev/null || break
  sleep 0.2
done
if ! ss -Hltn "sport = :$PORT" | grep -q .; then
  echo "softroce: node 0's QEMU is not listening on 127.0.0.1:$PORT" >&2
fi
start_node 1

VRC=(-1 -1)
GRACE="${SOFTROCE_PEER_GRACE:-60}"
FIRST_FAIL=""
remaining=("${PID[0]}" "${PID[1]}")
while ((${#remaining[@]})); do
  set +e
  wait -n -p done_pid "${remaining[@]}"; rc=$?
  set -e
  if [[ "$done_pid" == "${PID[0]}" ]]; then r=0; else r=1; fi
  date +%s.%N > "${W[r]}/t_end_host"
  echo "softroce: node$r VM ended (rc=$rc)" >&2
  VRC[r]=$rc
  o=$((1 - r))
  remaining=(); [[ ${VRC[o]} == -1 ]] && remaining=("${PID[o]}")
  if [[ $rc != 0 && ${VRC[o]} == -1 ]]; then
    # One node failed: give the other a grace period, then stop it (timeout forwards
    # the TERM to its process group: vng and QEMU).
    FIRST_FAIL=$r
    echo "softroce: node$r failed (rc=$rc); node$o gets ${GRACE}s more" >&2
    for _ in $(seq 1 "$GRACE"); do kill -0 "${PID[o]}" 2>/dev/null || break; sleep 1; done
    kill -TERM "${PID[o]}" 2>/dev/null && echo "softroce: stopped node$o" >&2
  fi
done
sleep 0.5   # let the sed prefixers flush

RC=()
for r in 0 1; do
  RC[r]="$(softroce_result "${W[r]}" "${VRC[r]}")"
  echo "softroce: node$r exit status ${RC[r]}" >&2
  [[ -n "${SOFTROCE_KEEP:-}" ]] && echo "softroce: kept ${W[r]}" >&2 || rm -rf "${W[r]}"
done
[[ -n "${SOFTROCE_KEEP:-}" ]] || rm -rf "$SOFTROCE_SHARED_DIR"
# Report the node that failed first (the other one may just have been stopped).
[[ -n "$FIRST_FAIL" ]] && exit "${RC[FIRST_FAIL]}"
if [[ ${RC[0]} != 0 ]]; then exit "${RC[0]}"; fi
exit "${RC[1]}"
