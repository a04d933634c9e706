#!/usr/bin/env bash
# Boots ONE Soft-RoCE VM (Debian kernel, QEMU TCG via virtme-ng) and runs a guest command.
#   scripts/softroce/run_vm.sh 'GUEST COMMAND LINE'
# Inside the guest, before the command: modprobe rdma_rxe, dummy0 = 10.99.0.1/24,
# `rdma link add rxe0 type rxe netdev dummy0`, wait for PORT_ACTIVE, ulimit -l unlimited.
# The guest sees the host's filesystem (read-only, /tmp etc. as throw-away overlays) and
# $SOFTROCE_RWDIR (default: the repository root) read-write. Guest env: NODE_RANK=0,
# NODE_ADDR, SOFTROCE_NETDEV, SOFTROCE_RDMA_DEV=rxe0, plus SOFTROCE_PASS_ENV="VAR ..." names.
# Env: SOFTROCE_CPUS (2) SOFTROCE_MEM (4G) SOFTROCE_TIMEOUT (1800 s, hard wall clock)
#      SOFTROCE_NAME (softroce0) SOFTROCE_KERNEL SOFTROCE_VERBOSE=1 SOFTROCE_KEEP=1
# Exit status: the guest command's; 124 on timeout; 86 if the VM or the RDMA setup failed.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=common.sh
source "$HERE/common.sh"
[[ $# -ge 1 ]] || { sed -n '2,13p' "$0" >&2; exit 2; }
softroce_check

NAME="${SOFTROCE_NAME:-softroce0}"
W="$(softroce_prepare_workdir "$NAME" dummy "${SOFTROCE_ADDR:-10.99.0.1}" "" 0 "" "$*")"
softroce_vng_args "$NAME" "$W"
SOFTROCE_WORKDIRS=("$W")

# QEMU opens /proc/self/fd/1 and /2 itself (O_TRUNC): if they are regular files, earlier
# output is overwritten. Pipes avoid that, so always hand it pipes.
softroce_trap_signals
timeout --kill-after=20 "${SOFTROCE_TIMEOUT:-1800}" "$VNG" "${VNG_ARGS[@]}" </dev/null \
  > >(cat) 2> >(cat >&2) &
SOFTROCE_PIDS=($!)
set +e
wait "${SOFTROCE_PIDS[0]}"
vrc=$?
date +%s.%N > "$W/t_end_host"
set -e
sleep 0.2   # let the output copiers flush
rc="$(softroce_result "$W" "$vrc")"
[[ -n "${SOFTROCE_KEEP:-}" ]] && echo "softroce: kept $W" >&2 || rm -rf "$W"
exit "$rc"
